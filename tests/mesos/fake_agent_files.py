"""A Mesos agent's `/files/read` endpoint, as src/files/files.cpp serves it (no recording of it is in
../shared/mesos-transcripts: this follows the source):

- `path` required (400 `Expecting 'path=value' in query.` without it); an unknown path is 404;
- `offset` absent means the end of the file (so `?path=P` alone answers the size), `length` absent the rest;
- a read is capped at 16 pages (65,536 bytes);
- at or past the end: `{"offset": <size>, "data": ""}`;
- `data` is the bytes as a JSON string: control characters escaped, other bytes written raw (not re-encoded).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PAGE = 4096


def _json_bytes(obj: dict[str, Any]) -> bytes:
    """stout's JSON writer: raw bytes in strings, only control characters, quote and backslash escaped."""
    parts = []
    for k, v in obj.items():
        if isinstance(v, bytes):
            out = bytearray(b'"')
            for b in v:
                if b in (0x22, 0x5C):
                    out += b"\\" + bytes([b])
                elif b < 0x20:
                    out += b"\\u%04x" % b
                else:
                    out.append(b)
            out += b'"'
            parts.append(json.dumps(k).encode() + b":" + bytes(out))
        else:
            parts.append(json.dumps(k).encode() + b":" + json.dumps(v).encode())
    return b"{" + b",".join(parts) + b"}"


class FakeAgentFiles:
    def __init__(self, principal: str | None = None, secret: str | None = None) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                u = urllib.parse.urlsplit(self.path)
                q = dict(urllib.parse.parse_qsl(u.query))
                owner.requests.append({"path": u.path, "query": q, "auth": self.headers.get("Authorization")})
                status, body = owner.answer(u.path, q, self.headers.get("Authorization"))
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if status == 200 else "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.credentials = None
        if principal:
            import base64

            self.credentials = "Basic " + base64.b64encode(f"{principal}:{secret or ''}".encode()).decode()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def answer(self, path: str, q: dict[str, str], auth: str | None) -> tuple[int, bytes]:
        if path != "/files/read":
            return 404, b""
        if self.credentials is not None and auth != self.credentials:
            return 401, b""
        name = q.get("path", "")
        if not name:
            return 400, b"Expecting 'path=value' in query.\n"
        if name not in self.files:
            return 404, b""
        data = self.files[name]
        size = len(data)
        offset = int(q["offset"]) if "offset" in q else -1
        length = int(q["length"]) if "length" in q else -1
        if offset == -1:
            offset = size
        if length == -1:
            length = size - offset
        length = min(length, PAGE * 16)
        if offset >= size:
            return 200, _json_bytes({"offset": size, "data": b""})
        return 200, _json_bytes({"offset": offset, "data": data[offset:offset + length]})

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
