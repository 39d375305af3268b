"""A TCP proxy in front of a real server, to inject network faults between the daemon and its store.

`cut()` drops every connection at once: what a server restart does to its clients (their transactions are rolled
back by the server when the connection goes). `down()` refuses new connections (and drops the current ones) until
`up()`: what a stopped server looks like. `blackhole()` forwards nothing more, either way, but keeps every connection
open and accepts new ones without answering: a machine whose network is cut (nobody sees a FIN or a RST, the
bytes are lost). `heal()` ends it: the connections held through the cut are reset, as the far side has long
given up on them, and new ones are forwarded again."""

from __future__ import annotations

import contextlib
import select
import socket
import threading


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._closed = False
        self._blackholed = False
        self._held: set[socket.socket] = set()  # connections accepted during a blackhole (never forwarded)
        self.connections = 0  # accepted so far
        self.up()

    # --- faults -----------------------------------------------------------------------------------------------
    def up(self) -> None:
        with self._lock:
            if self._listener is not None or self._closed:
                return
            ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind(("127.0.0.1", self.port))
            ls.listen(128)
            self.port = ls.getsockname()[1]
            self._listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            ls, self._listener = self._listener, None
        if ls is not None:
            with contextlib.suppress(OSError):
                ls.close()
        self.cut()

    def cut(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                c.close()

    def blackhole(self) -> None:
        with self._lock:
            self._blackholed = True

    def heal(self) -> None:
        with self._lock:
            self._blackholed = False
            held, self._held = self._held, set()
        for c in held:
            with contextlib.suppress(OSError):
                c.close()
        self.cut()

    def close(self) -> None:
        self._closed = True
        self.down()

    # --- forwarding ---------------------------------------------------------------------------------------
    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                client, _ = ls.accept()
            except OSError:
                return  # closed by down()
            with self._lock:
                if self._blackholed:  # the SYN got through, nothing else will
                    self._held.add(client)
                    continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not ls:  # went down meanwhile
                    client.close()
                    server.close()
                    return
                self._conns |= {client, server}
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while True:
                ready, _, _ = select.select([a, b], [], [], 1.0)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    if not self._blackholed:  # else lost on the way
                        peers[s].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            with self._lock:
                self._conns.discard(a)
                self._conns.discard(b)
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()
