"""A gang member that cannot finish alone: rank 0 listens on MASTER_PORT and releases everyone only after all
WORLD_SIZE-1 peers have connected; the others connect to MASTER_ADDR:MASTER_PORT and wait for "go"."""

import os
import socket
import sys
import time

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
print(f"rank={rank} world={world} master={addr}:{port} peers={os.environ['PELOTON_PEERS']} "
      f"hosts={os.environ['PELOTON_HOSTS']} local_rank={os.environ['LOCAL_RANK']} "
      f"attempt={os.environ['PELOTON_ATTEMPT']} task={os.environ['PELOTON_TASK_ID']}", flush=True)
with open(os.environ["PELOTON_HOSTFILE"]) as f:
    print("hostfile:", f.read().strip().replace("\n", ";"), flush=True)

if rank == 0:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(world)
    srv.settimeout(120)
    peers: list[socket.socket] = []
    while len(peers) < world - 1:
        conn, _ = srv.accept()
        peers.append(conn)
        print(f"peer {len(peers)} connected", flush=True)
    for c in peers:
        c.sendall(b"go")
        c.close()
    print("all peers connected", flush=True)
else:
    deadline = time.time() + 120
    while True:
        try:
            s = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                sys.exit("rank 0 never came up")
            time.sleep(0.1)
    s.settimeout(120)
    assert s.recv(2) == b"go"
    print("released by rank 0", flush=True)
