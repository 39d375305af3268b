#!/usr/bin/env bash
# `make test`'s pytest. With arguments: pytest with them. Without: the whole suite as two pytest processes at
# once, the in-process tests (tests/unit, tests/store: about 2.5 minutes, mostly CPU) beside the ones that start
# daemons and clusters (tests/api, tests/e2e, tests/mesos, tests/faults: mostly waiting on them), so a 2-core
# machine is busy while daemons start; the first group's output is printed after the second's. Both groups must
# pass. Every test creates its own databases, directories and ports, so the two do not meet.
set -uo pipefail
PYTEST=${PYTEST:-.venv/bin/pytest}
if [ $# -gt 0 ]; then
  exec "$PYTEST" -q -p no:cacheprovider "$@"
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$PYTEST" -q -p no:cacheprovider tests/unit tests/store >"$out" 2>&1 &
inproc=$!
"$PYTEST" -q -p no:cacheprovider tests/api tests/e2e tests/mesos tests/faults
rest=$?
wait "$inproc"
first=$?
echo "--- tests/unit and tests/store (run beside the above):"
cat "$out"
[ "$first" -eq 0 ] && [ "$rest" -eq 0 ]
