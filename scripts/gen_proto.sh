#!/usr/bin/env bash
# Regenerate the committed protobuf/gRPC code from proto/. `--check` fails if the committed code is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
out=peloton/api/v1
if [ "${1:-}" = "--check" ]; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  "$PY" -m grpc_tools.protoc -Iproto --python_out="$tmp" --pyi_out="$tmp" --grpc_python_out="$tmp" proto/peloton/v1/*.proto
  "$PY" scripts/fix_proto_imports.py "$tmp/peloton/v1"
  if ! diff -r -q -x __init__.py -x __pycache__ "$tmp/peloton/v1" "$out"; then
    echo "generated code in $out is stale: run 'make proto' and commit" >&2; exit 1
  fi
  echo "generated code is up to date"
  exit 0
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$PY" -m grpc_tools.protoc -Iproto --python_out="$tmp" --pyi_out="$tmp" --grpc_python_out="$tmp" proto/peloton/v1/*.proto
"$PY" scripts/fix_proto_imports.py "$tmp/peloton/v1"
rm -f "$out"/*_pb2*.py "$out"/*_pb2*.pyi
mkdir -p "$out"
cp "$tmp"/peloton/v1/*_pb2*.py* "$out"/
