#!/usr/bin/env bash
# The local backend on a machine with real NVIDIA GPUs (docs/development.md, "On a machine with GPUs"): what the
# daemon detects, a 1-GPU member that computes on the GPU it was given, a GPU held by one job and handed to the
# next when it ends, and a gang asking for more GPUs than the machine has staying whole in the queue. Needs
# nvidia-smi and a python with torch built for CUDA (TORCH_PYTHON, default python3) for the members; the daemon
# runs under PYTHON (default python3) with the project importable. Prints what it saw, writes the daemon's log
# and the tasks' outputs under OUT (default a new temporary directory), exits non-zero at the first check that
# fails. Runs the daemon with its defaults (as root, members run as `nobody` in a cgroup each) and SERVER_ARGS.
set -uo pipefail
PY=${PYTHON:-python3}
TORCH_PY=${TORCH_PYTHON:-python3}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
data=$(mktemp -d)
ADDR=unix:$data/peloton.sock  # the owner-only socket: this user needs no token
files=$(mktemp -d)  # what the members read: they may run as another user
chmod 755 "$files"
peloton() { "$PY" -c 'import sys; from peloton.cli.main import main; sys.exit(main())' --address "$ADDR" "$@"; }
fail() { echo "FAIL: $*"; exit 1; }
state() { peloton -o json job get "$1" | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["status"]["state"])'; }
wait_state() {  # JOB STATE SECONDS
  local s
  for _ in $(seq $((${3} * 5))); do
    s=$(state "$1")
    [ "$s" = "$2" ] && return 0
    sleep 0.2
  done
  echo "job $1 is $s, not $2, after $3 s"
  return 1
}
create() {  # SPEC_FILE -> job id
  peloton -o json job create -f "$1" | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["job_id"])'
}

echo "== nvidia-smi"
nvidia-smi -L || fail "nvidia-smi"
n=$(nvidia-smi --query-gpu=index --format=csv,noheader | grep -c .)
echo "== what the local backend detects ($n GPUs by nvidia-smi)"
"$PY" -c 'from peloton.hostmgr.local.gpus import detect, machine_resources
print("detected:", detect()); print("machine:", machine_resources())'

"$PY" -c 'import sys; from peloton.cli.main import main; sys.exit(main())' server --data-dir "$data" \
  --listen 127.0.0.1:${PORT:-5391} --unix-socket "$data/peloton.sock" ${SERVER_ARGS:-} >"$OUT/daemon.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null' EXIT
for _ in $(seq 100); do peloton host list >/dev/null 2>&1 && break; sleep 0.2; done
peloton host list -o json >"$OUT/hosts.json" || fail "the daemon did not start (daemon.log)"
peloton host list
gpus=$("$PY" -c 'import json, sys; print(sum(int(h["capacity"].get("gpu", 0)) for h in json.load(open(sys.argv[1]))["hosts"]))' \
  "$OUT/hosts.json")
[ "$gpus" = "$n" ] || fail "the daemon offers $gpus GPUs, nvidia-smi lists $n"

echo "== a 1-GPU member computes on the GPU it was given"
cat >"$files/gpu1.py" <<'EOF'
import os, torch
print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
print("cuda available:", torch.cuda.is_available(), "devices:", torch.cuda.device_count())
print("device 0:", torch.cuda.get_device_name(0))
a = torch.randn(4096, 4096, device="cuda")
print("matmul sum finite:", bool(torch.isfinite((a @ a).sum()).item()))
assert torch.cuda.device_count() == 1
EOF
cat >"$OUT/gpu1.yaml" <<EOF
name: gpu-check
instances: 1
task:
  command: nvidia-smi -L; $TORCH_PY $files/gpu1.py
  resources: {cpu: 1, mem: 4Gi, gpu: 1}
EOF
j1=$(create "$OUT/gpu1.yaml") || fail "create"
wait_state "$j1" SUCCEEDED 120; ok=$?
peloton task list "$j1"
peloton task logs "$j1" 0 | tee "$OUT/gpu1.out"
peloton task logs --stderr "$j1" 0 | tail -20
[ $ok -eq 0 ] || fail "the 1-GPU member"

echo "== the GPUs held by one job go to the next gang, whole, when it ends"
cat >"$OUT/hold.yaml" <<EOF
name: gpu-hold
instances: $n
task:
  command: echo "held [\$CUDA_VISIBLE_DEVICES]"; sleep 6
  resources: {cpu: 1, mem: 1Gi, gpu: 1}
EOF
cat >"$OUT/next.yaml" <<EOF
name: gpu-next
instances: $n
task:
  command: echo "next [\$CUDA_VISIBLE_DEVICES]"
  resources: {cpu: 1, mem: 1Gi, gpu: 1}
EOF
jh=$(create "$OUT/hold.yaml") || fail "create"
wait_state "$jh" RUNNING 30 || fail "the holding job"
jn=$(create "$OUT/next.yaml") || fail "create"
sleep 2
s=$(state "$jn"); echo "while every GPU is held, the next job is $s"
running=$(peloton -o json task list "$jn" | "$PY" -c 'import json, sys; print(sum(t["state"] == "RUNNING" for t in json.load(sys.stdin)["tasks"]))')
[ "$s" = PENDING ] && [ "$running" = 0 ] || fail "a member ran without a free GPU"
wait_state "$jn" SUCCEEDED 60 || fail "the next job after the GPU came free"
peloton task logs "$jh" 0; peloton task logs "$jn" 0

echo "== a gang of $((n + 1)) 1-GPU members, more than the $n GPUs there are, is refused whole"
cat >"$OUT/toobig.yaml" <<EOF
name: gpu-toobig
instances: $((n + 1))
task:
  command: sleep 1
  resources: {cpu: 1, mem: 1Gi, gpu: 1}
EOF
if peloton job create -f "$OUT/toobig.yaml" 2>"$OUT/toobig.err"; then fail "a gang that can never fit was created"; fi
cat "$OUT/toobig.err"
grep -q "can never fit" "$OUT/toobig.err" || fail "the refusal does not say why"
echo "== every check passed"
