"""Task logs on Mesos: read from the task's sandbox on its agent, over the agent's HTTP files API.

`GET http://<agent>:<port>/files/read?path=P&offset=N&length=M` answers `{"offset": N, "data": "<bytes>"}`: at most
16 pages (64 KiB) per call, `{"offset": <size>, "data": ""}` at or past the end, and without `offset` the file's size
(Mesos src/files/files.cpp). The agent attaches each executor's sandbox at the virtual path
`/frameworks/<framework id>/executors/<executor id>/runs/latest`; a command task's executor id is its task id. The
agent writes `data` as the file's raw bytes in a JSON string (only control characters escaped), so the body is
decoded with surrogateescape to get the bytes back. An agent with HTTP authentication gets the framework's
principal and secret (basic)."""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.parse
from collections.abc import Callable

from peloton.errors import FailedPrecondition, Unavailable

MAX_READ = 16 * 4096  # what one /files/read answers at most (16 pages)
TIMEOUT_S = 10.0

ReadChunk = Callable[[str, int | None, int], tuple[bytes, int]]  # (path, offset or None for the size, length)


def sandbox_path(framework_id: str, task_id: str, stream: str) -> str:
    return f"/frameworks/{framework_id}/executors/{task_id}/runs/latest/{stream}"


def read_log(read_chunk: ReadChunk, path: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
    """Up to `max_bytes` from `offset` (negative: that far from the end); (data, the offset after it)."""
    if offset < 0:
        _, size = read_chunk(path, None, 0)
        offset = max(0, size + offset)
    data = bytearray()
    pos = offset
    while len(data) < max_bytes:
        chunk, at = read_chunk(path, pos, min(MAX_READ, max_bytes - len(data)))
        if not chunk:
            pos = min(pos, at)  # at or past the end: the agent says where the end is
            break
        data += chunk
        pos = at + len(chunk)
    return bytes(data), pos


class AgentFiles:
    """The files API of the agents (one short HTTP connection per call)."""

    def __init__(self, scheme: str = "http", authorization: str | None = None,
                 ssl_context: ssl.SSLContext | None = None, timeout_s: float = TIMEOUT_S) -> None:
        self.scheme = scheme
        self._auth = authorization
        self._ssl = ssl_context
        self.timeout_s = timeout_s

    def reader(self, host: str, port: int) -> ReadChunk:
        def read_chunk(path: str, offset: int | None, length: int) -> tuple[bytes, int]:
            return self._read(host, port, path, offset, length)

        return read_chunk

    def _read(self, host: str, port: int, path: str, offset: int | None, length: int) -> tuple[bytes, int]:
        query = {"path": path, **({"offset": str(offset), "length": str(length)} if offset is not None else {})}
        conn = (http.client.HTTPSConnection(host, port, timeout=self.timeout_s, context=self._ssl)
                if self.scheme == "https" else http.client.HTTPConnection(host, port, timeout=self.timeout_s))
        where = f"agent {host}:{port}"
        try:
            conn.request("GET", "/files/read?" + urllib.parse.urlencode(query),
                         headers={"Accept": "application/json", **({"Authorization": self._auth} if self._auth else {})})
            resp = conn.getresponse()
            body = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise Unavailable(f"cannot read the task's log from {where}: {e}") from None
        finally:
            conn.close()
        if resp.status == 404:
            raise FailedPrecondition(f"{where} has no such file ({path}): the task's sandbox is gone (the agent "
                                     "collects sandboxes after --gc_delay) or never existed")
        if resp.status in (401, 403):
            raise FailedPrecondition(f"{where} refused to serve the task's log (HTTP {resp.status}): the "
                                     "framework's principal may not read its sandboxes (the agents' ACLs)")
        if resp.status != 200:
            raise Unavailable(f"{where} answered HTTP {resp.status} reading {path}: "
                              f"{body[:200].decode('utf-8', 'replace').strip()}")
        try:
            doc = json.loads(body.decode("utf-8", "surrogateescape"))
            return str(doc["data"]).encode("utf-8", "surrogateescape"), int(doc["offset"])
        except (ValueError, KeyError, TypeError) as e:
            raise Unavailable(f"{where} sent an unreadable answer for {path}: {e}") from None
