#!/usr/bin/env bash
# Regenerate the committed protobuf/gRPC code from proto/. `--check` fails if the committed code is stale.
# The modules come from grpcio-tools' protoc (--python_out, --grpc_python_out); their type stubs (.pyi) from
# mypy-protobuf's plugins: messages (field names, HasField/ClearField literals) and the gRPC stubs and servicers
# (each method's request and response types), which mypy checks the servicers against. Both generators are pinned
# in pyproject.toml's dev extras: another release writes other code and the check would fail with no change here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
bin=$(dirname "$PY")
out=peloton/api/v1

generate() {  # into $1
  "$PY" -m grpc_tools.protoc -Iproto --python_out="$1" --grpc_python_out="$1" \
    --plugin=protoc-gen-mypy="$bin/protoc-gen-mypy" --mypy_out="$1" \
    --plugin=protoc-gen-mypy_grpc="$bin/protoc-gen-mypy_grpc" --mypy_grpc_out="$1" \
    proto/peloton/v1/*.proto 2> >(grep -v '^Writing mypy to' >&2)  # (mypy-protobuf names each file it writes)
  "$PY" scripts/fix_proto_imports.py "$1/peloton/v1"
}

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
generate "$tmp"
if [ "${1:-}" = "--check" ]; then
  if ! diff -r -q -x __init__.py -x __pycache__ "$tmp/peloton/v1" "$out"; then
    echo "generated code in $out is stale: run 'make proto' and commit" >&2; exit 1
  fi
  echo "generated code is up to date"
  exit 0
fi
rm -f "$out"/*_pb2*.py "$out"/*_pb2*.pyi
mkdir -p "$out"
cp "$tmp"/peloton/v1/*_pb2*.py* "$out"/
