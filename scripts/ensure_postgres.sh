#!/usr/bin/env bash
# Make sure the local PostgreSQL answers on 127.0.0.1:5432; start the cluster if it is down.
set -u
ready() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null || \
  python3 -c "import socket; socket.create_connection(('127.0.0.1', 5432), 2)" 2>/dev/null; }
if ready; then exit 0; fi
if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
  echo "PostgreSQL is down: starting it"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  for _ in $(seq 1 30); do ready && exit 0; sleep 1; done
fi
echo "PostgreSQL is not reachable on 127.0.0.1:5432; the PostgreSQL tests will fail" >&2
exit 0
