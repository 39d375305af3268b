#!/usr/bin/env bash
# The oldest install pyproject.toml allows, checked: a fresh venv with every runtime dependency at exactly its
# declared floor (scripts/min_deps.py turns `>=X` into `==X` constraints), then every module of the installed
# package imported, the CLI's and the daemon's start-up, and the tests that exercise each dependency.
#
# CI runs it after `make test` (`make min-deps`). To find a floor: lower it in pyproject.toml and run this again.
# MIN_DEPS_TESTS: other tests to run than the default selection.
#
# Wheels only (--only-binary): a floor that needs a compiler on the oldest Python the project supports (3.11, which
# CI runs) is not a floor.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
venv=${MIN_DEPS_VENV:-.venv-min}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

rm -rf "$venv"
"$PY" -m venv "$venv"
"$PY" scripts/min_deps.py >"$work/constraints.txt"
names=$(cut -d= -f1 "$work/constraints.txt" | paste -sd, -)
echo "minimum dependencies: $(paste -sd ' ' "$work/constraints.txt")"
# the package itself is built from this checkout (not --only-binary); its dependencies must come as wheels. The
# test tools are not the package's dependencies: any version.
# (this machine's pip configuration names local index folders that may not exist: their warnings are dropped)
"$venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary "$names" \
  -c "$work/constraints.txt" . pytest pytest-timeout hypothesis 2> >(grep -v "is ignored: it is neither" >&2)
"$venv/bin/python" scripts/min_deps.py --verify

# outside the checkout, so that `peloton` is the installed wheel's (its migrations, its entry point)
(
  cd "$work"
  "$OLDPWD/$venv/bin/python" - <<'EOF'
import importlib
import pkgutil

import peloton

assert "site-packages" in peloton.__file__, peloton.__file__
skip = ("peloton.migrations",)  # alembic's env.py runs only under alembic (`peloton db upgrade` below runs it)
names = [m.name for m in pkgutil.walk_packages(peloton.__path__, "peloton.") if not m.name.startswith(skip)]
for name in names:
    importlib.import_module(name)
print(f"imported {len(names)} modules of peloton")
EOF
  bin="$OLDPWD/$venv/bin"
  "$bin/peloton" --help >/dev/null
  "$bin/peloton" server --print-config --data-dir "$work/data" >/dev/null
  "$bin/peloton" db upgrade --db "sqlite:///$work/peloton.db"
  "$bin/peloton" certs init "$work/certs" >/dev/null
  echo "peloton --help, server --print-config, db upgrade, certs init: ok"
)

# the tests that exercise each dependency (from the checkout: its peloton is the same code, on these dependencies): the store on SQLite and PostgreSQL (SQLAlchemy,
# alembic, psycopg2), gRPC with health and reflection (grpcio, protobuf), the spec and config files (PyYAML), the
# metrics endpoint with TLS (prometheus-client), and `certs init`'s certificates in a real mutual-TLS handshake
# (cryptography; tests/unit/test_certs.py checks them with a verifier that only cryptography 42 has, so not here)
"$venv/bin/python" -m pytest -q -p no:cacheprovider ${MIN_DEPS_TESTS:-\
  tests/store/test_migrations.py tests/store/test_repo.py tests/store/test_writer.py \
  tests/api/test_grpc_api.py tests/unit/test_transport.py \
  tests/unit/test_spec.py tests/unit/test_server_config.py tests/unit/test_census.py \
  tests/e2e/test_metrics_e2e.py tests/e2e/test_tls_e2e.py}
