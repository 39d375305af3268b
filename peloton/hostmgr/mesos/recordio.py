"""RecordIO framing of the Mesos event stream: `<decimal byte length>\\n<payload>`, repeated, nothing between.

Pure (no I/O). Works on bytes, never str: the length counts payload *bytes*, so decoding to text before
slicing breaks on non-ASCII payloads. Chunk boundaries of the HTTP body are unrelated to record boundaries.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_RECORD", "RecordIODecoder", "RecordIOError", "encode"]

DEFAULT_MAX_RECORD = 64 * 1024 * 1024  # one OFFERS event of a big cluster is well below this
_MAX_DIGITS = 20  # a uint64 has at most 20 decimal digits


class RecordIOError(ValueError):
    """The stream is not valid RecordIO (bad or oversized length). The stream cannot be resynchronised."""


class RecordIODecoder:
    """Incremental decoder: `feed()` any chunk of the de-chunked body, get back every record it completes.

    After a RecordIOError the decoder is poisoned (every later feed raises too): the caller must drop the
    connection and start over with a fresh decoder.
    """

    def __init__(self, max_record: int = DEFAULT_MAX_RECORD) -> None:
        self._buf = bytearray()
        self._need: int | None = None  # payload length of the record being read, once its header is parsed
        self._max = max_record
        self._error: RecordIOError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held back waiting for the rest of a record."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        if self._error is not None:
            raise self._error
        self._buf += data
        out: list[bytes] = []
        while True:
            if self._need is None:
                nl = self._buf.find(b"\n", 0, _MAX_DIGITS + 1)
                if nl < 0:
                    if len(self._buf) > _MAX_DIGITS or not bytes(self._buf).isdigit() and self._buf:
                        self._fail(f"bad record length {bytes(self._buf[:_MAX_DIGITS + 1])!r}")
                    return out
                head = bytes(self._buf[:nl])
                if not head or not head.isdigit():
                    self._fail(f"bad record length {head!r}")
                n = int(head)
                if n == 0:
                    self._fail("record length 0 (Mesos never sends empty records)")
                if n > self._max:
                    self._fail(f"record of {n} bytes exceeds the {self._max}-byte limit")
                del self._buf[: nl + 1]
                self._need = n
            if len(self._buf) < self._need:
                return out
            out.append(bytes(self._buf[: self._need]))
            del self._buf[: self._need]
            self._need = None

    def _fail(self, why: str) -> None:
        self._error = RecordIOError(f"RecordIO: {why}")
        raise self._error


def encode(record: bytes) -> bytes:
    """Frame one record: `b'{"a":1}'` -> `b'7\\n{"a":1}'`."""
    if not record:
        raise ValueError("RecordIO records must not be empty")
    return str(len(record)).encode("ascii") + b"\n" + bytes(record)
