#!/usr/bin/env bash
# `make test`'s pytest. With arguments: pytest with them. Without: the whole suite as three pytest processes at
# once. The suite waits more than it computes (daemons starting, jobs running, polls: its processes used about one
# of a 2-core machine's cores with two of them), so three keep both cores busy:
#   1. the in-process tests (tests/unit, tests/store, tests/api: mostly CPU), the store fault test (tests/faults)
#      and the placement engines' end-to-end tests;
#   2. the Mesos tests (a fake master each), the web console's end-to-end tests (HTTP, the browser, the edge checks),
#      the big jobs' and the preemption tests;
#   3. the other end-to-end tests (tests/e2e: mostly waiting on real daemons).
# Each takes about a third of the time (docs/development.md). The third's output comes first, then the first's and
# the second's. All three must pass. Every test creates its own databases, directories and ports, so they do not
# meet.
set -uo pipefail
PYTEST=${PYTEST:-.venv/bin/pytest}
if [ $# -gt 0 ]; then
  exec "$PYTEST" -q -p no:cacheprovider "$@"
fi
FIRST=(tests/unit tests/store tests/api tests/faults tests/e2e/test_placement_engines_e2e.py)
SECOND=(tests/mesos tests/e2e/test_console_e2e.py tests/e2e/test_console_browser_e2e.py tests/e2e/test_console_auth_e2e.py
        tests/e2e/test_console_auth_browser_e2e.py tests/e2e/test_edge_checks_e2e.py tests/e2e/test_big_jobs_e2e.py
        tests/e2e/test_preemption_e2e.py)
ignore=()
for f in "${FIRST[@]}" "${SECOND[@]}"; do
  case $f in tests/e2e/*) ignore+=("--ignore=$f") ;; esac
done
first=$(mktemp)
second=$(mktemp)
trap 'rm -f "$first" "$second"' EXIT
"$PYTEST" -q -p no:cacheprovider "${FIRST[@]}" >"$first" 2>&1 &
first_pid=$!
"$PYTEST" -q -p no:cacheprovider "${SECOND[@]}" >"$second" 2>&1 &
second_pid=$!
"$PYTEST" -q -p no:cacheprovider "${ignore[@]}" tests/e2e
third_rc=$?
wait "$first_pid"
first_rc=$?
wait "$second_pid"
second_rc=$?
echo "--- tests/unit, tests/store, tests/api, tests/faults, the placement engines' e2e tests (run beside the above):"
cat "$first"
echo "--- tests/mesos, the console's, the big jobs' and the preemption e2e tests (run beside the above):"
cat "$second"
[ "$first_rc" -eq 0 ] && [ "$second_rc" -eq 0 ] && [ "$third_rc" -eq 0 ]
