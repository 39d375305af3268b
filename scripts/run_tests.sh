#!/usr/bin/env bash
# `make test`'s pytest. With arguments: pytest with them. Without: the whole suite as two pytest processes at
# once, so a 2-core machine is busy while daemons start: the in-process tests (tests/unit, tests/store: mostly CPU)
# with the API and Mesos tests (a daemon or a fake master each), the store fault test (tests/faults: a daemon
# waiting out PostgreSQL's restarts and outage) and the web console's and the placement engines' end-to-end tests
# (moved here so that the halves take about as long) beside the other e2e tests (tests/e2e: mostly waiting on real
# daemons and clusters). The first group's output is printed after the second's. Both groups must pass. Every test
# creates its own databases, directories and ports, so the two do not meet.
set -uo pipefail
PYTEST=${PYTEST:-.venv/bin/pytest}
if [ $# -gt 0 ]; then
  exec "$PYTEST" -q -p no:cacheprovider "$@"
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$PYTEST" -q -p no:cacheprovider tests/unit tests/store tests/api tests/mesos tests/faults tests/e2e/test_console_*.py \
  tests/e2e/test_placement_engines_e2e.py >"$out" 2>&1 &
inproc=$!
"$PYTEST" -q -p no:cacheprovider --ignore-glob='tests/e2e/test_console_*.py' \
  --ignore=tests/e2e/test_placement_engines_e2e.py tests/e2e
rest=$?
wait "$inproc"
first=$?
echo "--- tests/unit, tests/store, tests/api, tests/mesos, tests/faults, the console's and the placement engines' e2e tests (run beside the above):"
cat "$out"
[ "$first" -eq 0 ] && [ "$rest" -eq 0 ]
