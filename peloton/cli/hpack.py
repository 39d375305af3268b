"""HPACK (RFC 7541), the header compression of HTTP/2, as much of it as a gRPC client needs: a full decoder
(static and dynamic tables, Huffman strings) for what the server sends, and an encoder that writes every header as
a literal that is never added to the table (always valid; a CLI call sends a handful of short headers once).

Standard library only: this is on the start-up path of every CLI command."""

from __future__ import annotations

STATIC_TABLE: tuple[tuple[bytes, bytes], ...] = tuple(
    (name.encode(), value.encode()) for name, value in (
        (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"), (":path", "/index.html"),
        (":scheme", "http"), (":scheme", "https"), (":status", "200"), (":status", "204"), (":status", "206"),
        (":status", "304"), (":status", "400"), (":status", "404"), (":status", "500"), ("accept-charset", ""),
        ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""), ("accept", ""),
        ("access-control-allow-origin", ""), ("age", ""), ("allow", ""), ("authorization", ""),
        ("cache-control", ""), ("content-disposition", ""), ("content-encoding", ""), ("content-language", ""),
        ("content-length", ""), ("content-location", ""), ("content-range", ""), ("content-type", ""),
        ("cookie", ""), ("date", ""), ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""),
        ("if-match", ""), ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""),
        ("if-unmodified-since", ""), ("last-modified", ""), ("link", ""), ("location", ""), ("max-forwards", ""),
        ("proxy-authenticate", ""), ("proxy-authorization", ""), ("range", ""), ("referer", ""), ("refresh", ""),
        ("retry-after", ""), ("server", ""), ("set-cookie", ""), ("strict-transport-security", ""),
        ("transfer-encoding", ""), ("user-agent", ""), ("vary", ""), ("via", ""), ("www-authenticate", ""),
    ))

# The Huffman code of RFC 7541 Appendix B is canonical, so the length of each symbol's code (symbols 0-255, then
# EOS, one base-36 digit each) defines it: codes are handed out in order of (length, symbol).
_LENGTHS = ("dnsssssssoussussssssssusssssssss6aacd68baa8b8666555666666678f6cad67777777777777777777777878djde6f56565666"
            "577666567655677777fbedskmkkmmmnmnnnnnonoomnonnnnlmnmnnomlkmmnnlnmmolmnnllmlnmnnkmmmnmmnqqkjmnmpqqqrrqopj"
            "lqrrqrollqqsrrrkoklmllnmmppooqnqrqqrrrrrsrrrrrqu")
EOS = 256
_huffman: dict[tuple[int, int], int] | None = None  # (length, code) -> symbol, built on first use


DEFAULT_TABLE_SIZE = 4096  # SETTINGS_HEADER_TABLE_SIZE's initial value: what the client allows the server


class HpackError(Exception):
    """The peer sent a header block that does not decode (a connection error: COMPRESSION_ERROR)."""


class HeaderListTooLarge(HpackError):
    """A header block that decodes to more than the decoder allows (a few bytes can name a large table entry again
    and again): decoding stops there, so the table is out of step and the connection must end."""


def huffman_codes() -> dict[tuple[int, int], int]:
    global _huffman
    if _huffman is None:
        lengths = [int(c, 36) for c in _LENGTHS]
        table: dict[tuple[int, int], int] = {}
        code, prev = -1, 0
        for sym in sorted(range(257), key=lambda s: (lengths[s], s)):
            code = (code + 1) << (lengths[sym] - prev)
            prev = lengths[sym]
            table[(prev, code)] = sym
        _huffman = table
    return _huffman


def huffman_decode(data: bytes) -> bytes:
    codes = huffman_codes()
    out = bytearray()
    code = length = 0
    for byte in data:
        for shift in range(7, -1, -1):
            code = (code << 1) | ((byte >> shift) & 1)
            length += 1
            sym = codes.get((length, code)) if length >= 5 else None
            if sym is not None:
                if sym == EOS:
                    raise HpackError("Huffman string holds EOS")
                out.append(sym)
                code = length = 0
            elif length > 30:
                raise HpackError("bad Huffman code")
    # what is left is padding: fewer than 8 bits, all ones (the start of EOS)
    if length > 7 or code != (1 << length) - 1:
        raise HpackError("bad Huffman padding")
    return bytes(out)


def _integer(data: bytes, pos: int, prefix: int) -> tuple[int, int]:
    limit = (1 << prefix) - 1
    value = data[pos] & limit
    pos += 1
    if value < limit:
        return value, pos
    shift = 0
    while True:
        if pos >= len(data):
            raise HpackError("truncated integer")
        b = data[pos]
        pos += 1
        value += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos
        if shift > 28:
            raise HpackError("integer too large")


def _string(data: bytes, pos: int) -> tuple[bytes, int]:
    if pos >= len(data):
        raise HpackError("truncated string")
    huffman = data[pos] & 0x80
    length, pos = _integer(data, pos, 7)
    if pos + length > len(data):
        raise HpackError("truncated string")
    raw = data[pos:pos + length]
    return (huffman_decode(raw) if huffman else raw), pos + length


class Decoder:
    """Decodes the header blocks of one connection, in order (they share the dynamic table)."""

    def __init__(self, max_table_size: int = DEFAULT_TABLE_SIZE, max_list_size: int | None = None) -> None:
        """`max_list_size`: the most one block may decode to, counted as SETTINGS_MAX_HEADER_LIST_SIZE counts (each
        field's name and value, plus 32)."""
        self.max_allowed = max_table_size  # what we told the peer (SETTINGS_HEADER_TABLE_SIZE)
        self.max_list_size = max_list_size
        self.max_size = max_table_size
        self.size = 0
        self.dynamic: list[tuple[bytes, bytes]] = []  # newest first

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if 1 <= index <= len(STATIC_TABLE):
            return STATIC_TABLE[index - 1]
        i = index - len(STATIC_TABLE) - 1
        if 0 <= i < len(self.dynamic):
            return self.dynamic[i]
        raise HpackError(f"header index {index} out of range")

    def _add(self, name: bytes, value: bytes) -> None:
        self.dynamic.insert(0, (name, value))
        self.size += len(name) + len(value) + 32
        self._evict()

    def _evict(self) -> None:
        while self.size > self.max_size and self.dynamic:
            n, v = self.dynamic.pop()
            self.size -= len(n) + len(v) + 32

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        headers: list[tuple[str, str]] = []
        pos = 0
        size = 0
        while pos < len(block):
            b = block[pos]
            if b & 0x80:  # indexed
                index, pos = _integer(block, pos, 7)
                if index == 0:
                    raise HpackError("header index 0")
                name, value = self._entry(index)
            elif b & 0xE0 == 0x20:  # dynamic table size update
                if headers:  # RFC 7541 4.2: only at the start of a block
                    raise HpackError("table size update after a header field")
                size_update, pos = _integer(block, pos, 5)
                if size_update > self.max_allowed:
                    raise HpackError(f"table size {size_update} over the {self.max_allowed} allowed")
                self.max_size = size_update
                self._evict()
                continue
            else:  # a literal: with incremental indexing (01), without (0000) or never indexed (0001)
                indexing = bool(b & 0x40)
                index, pos = _integer(block, pos, 6 if indexing else 4)
                if index:
                    name = self._entry(index)[0]
                else:
                    name, pos = _string(block, pos)
                value, pos = _string(block, pos)
                if indexing:
                    self._add(name, value)
            size += len(name) + len(value) + 32
            if self.max_list_size is not None and size > self.max_list_size:
                raise HeaderListTooLarge(f"a header list over the {self.max_list_size} bytes this client accepts "
                                         f"(after {len(headers)} fields)")
            headers.append((name.decode("latin-1"), value.decode("latin-1")))
        return headers


def _encode_integer(value: int, prefix: int, first: int) -> bytes:
    limit = (1 << prefix) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode(headers: list[tuple[str, str]]) -> bytes:
    """Literal header fields without indexing, new names, no Huffman: valid for any decoder, changes no table."""
    out = bytearray()
    for name, value in headers:
        n, v = name.encode("latin-1"), value.encode("latin-1")
        out += b"\x00" + _encode_integer(len(n), 7, 0) + n + _encode_integer(len(v), 7, 0) + v
    return bytes(out)
