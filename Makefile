# The two commands: `make run` and `make test`. Everything else is for developers.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck proto proto-check min-deps bench bench-peers venv clean pg

# The editable install in compat mode: a plain path in a .pth file; the default editable mode installs an import
# hook that costs every Python start-up (each CLI call) ~14 ms. Falls back to it if a future setuptools drops compat
# (its banner saying so is silenced: it is meant for the project's developers, who read this). Then peloton's
# byte-code, which the editable install leaves to the interpreter: where PYTHONDONTWRITEBYTECODE is set it writes
# none, and every daemon start and CLI call compiled peloton again (docs/performance.md).
$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	PYTHONWARNINGS='ignore:Compat editable installs' \
	  $(BIN)/python -m pip install -q -e '.[dev]' --config-settings editable_mode=compat \
	  || $(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m compileall -q peloton
	touch $(STAMP)

venv: $(STAMP)

## Start the daemon on the embedded defaults: SQLite in ~/.local/share/peloton, local backend on this machine.
## The daemon applies the migrations itself before serving (same as `peloton db upgrade`).
run: $(STAMP)
	exec $(BIN)/peloton server $(ARGS)

## Lint (ruff; vulture: dead code), types (peloton and the tests), architecture contracts, generated-code check, the
## declared minimum dependencies, then every test (SQLite and PostgreSQL).
test: $(STAMP) pg lint typecheck proto-check
	$(BIN)/lint-imports
	PYTEST=$(BIN)/pytest bash scripts/run_tests.sh $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/vulture

typecheck: $(STAMP)
	$(BIN)/mypy

proto: $(STAMP)
	PYTHON=$(BIN)/python bash scripts/gen_proto.sh

proto-check: $(STAMP)
	PYTHON=$(BIN)/python bash scripts/gen_proto.sh --check

## pyproject.toml's floors, each dependency at exactly its minimum in a fresh .venv-min: every module imports, the
## CLI and the daemon start, the tests of each dependency pass (about 2 minutes).
min-deps: pg
	PYTHON=$(PY) bash scripts/check_min_deps.sh

## PostgreSQL must be up for the tests (they create and drop their own databases).
pg:
	@bash scripts/ensure_postgres.sh

## Ten benchmarks, short settings (about 11 minutes on 2 cores), each printing a table and writing JSON under
## benchmarks/results/: the six of the hot-path issue (1-6 of benchmarks/README.md), the model-aware plans against
## the public profiles (a second), a synced commit's cost, Pollux's workload-6 replayed per policy (half a minute),
## then the daemon's start and stop (a minute). Bigger
## runs: PLACEMENT_ARGS, LOCAL_ARGS, SIM_ARGS, MEMORY_ARGS, CLI_ARGS, SCHEDULING_ARGS, MODEL_ARGS, REPLAY_ARGS,
## STARTSTOP_ARGS (see
## benchmarks/README.md), e.g. `make bench MEMORY_ARGS='--tasks 100000'`.
bench: $(STAMP) pg
	$(BIN)/python benchmarks/placement_bench.py $(PLACEMENT_ARGS)
	$(BIN)/python benchmarks/local_bench.py $(LOCAL_ARGS)
	$(BIN)/python benchmarks/sim_bench.py $(SIM_ARGS)
	$(BIN)/python benchmarks/memory_bench.py $(MEMORY_ARGS)
	$(BIN)/python benchmarks/cli_bench.py $(CLI_ARGS)
	$(BIN)/python benchmarks/scheduling_bench.py $(SCHEDULING_ARGS)
	$(BIN)/python benchmarks/model_bench.py $(MODEL_ARGS)
	$(BIN)/python benchmarks/durability_bench.py
	$(BIN)/python benchmarks/replay_bench.py $(REPLAY_ARGS)
	$(BIN)/python benchmarks/startstop_bench.py --runs 3 $(STARTSTOP_ARGS)

## peloton (SQLite, PostgreSQL) side by side with Slurm on one workload (benchmarks/README.md, 13; about 6 minutes).
## Installs nothing: without Slurm it prints how (apt-get install -y slurmctld slurmd slurm-client munge) and
## skips it. Flags: PEERS_ARGS, e.g. `make bench-peers PEERS_ARGS='--peers slurm --seconds 60'`.
bench-peers: $(STAMP) pg
	$(BIN)/python benchmarks/peers_bench.py $(PEERS_ARGS)

clean:
	rm -rf $(VENV) .venv-min .pytest_cache .mypy_cache .ruff_cache .hypothesis
