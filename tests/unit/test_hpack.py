"""The CLI's HPACK decoder and encoder against the examples of RFC 7541 (Appendix C)."""

from __future__ import annotations

import pytest

from peloton.cli import hpack


def _hex(s: str) -> bytes:
    return bytes.fromhex(s.replace(" ", ""))


@pytest.mark.parametrize(("prefix", "encoded", "value"), [
    (5, "0a", 10),  # C.1.1
    (5, "1f9a0a", 1337),  # C.1.2
    (8, "2a", 42),  # C.1.3
])
def test_integers(prefix: int, encoded: str, value: int) -> None:
    assert hpack._integer(_hex(encoded), 0, prefix) == (value, len(_hex(encoded)))
    assert hpack._encode_integer(value, prefix, 0) == _hex(encoded)


# C.3 (raw strings) and C.4 (Huffman): three requests on one connection, the table carried over
REQUESTS: list[tuple[tuple[str, str], list[tuple[str, str]], int]] = [
    (("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d", "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"),
     [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")], 57),
    (("8286 84be 5808 6e6f 2d63 6163 6865", "8286 84be 5886 a8eb 1064 9cbf"),
     [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com"),
      ("cache-control", "no-cache")], 110),
    (("8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
      "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
     [(":method", "GET"), (":scheme", "https"), (":path", "/index.html"), (":authority", "www.example.com"),
      ("custom-key", "custom-value")], 164),
]


@pytest.mark.parametrize("huffman", [False, True], ids=["raw", "huffman"])
def test_the_rfc_request_examples(huffman: bool) -> None:
    d = hpack.Decoder()
    for encodings, headers, table_size in REQUESTS:
        assert d.decode(_hex(encodings[huffman])) == headers
        assert d.size == table_size


def test_eviction_keeps_the_table_within_its_size() -> None:
    d = hpack.Decoder()
    d.decode(b"\x3f\xe1\x01")  # size update to 256 (5-bit prefix: 31 + 225)
    assert d.max_size == 256
    for i in range(10):  # each entry is 32 + 4 + 60 = 96 bytes: two fit
        d.decode(b"\x40\x04name" + bytes([60]) + bytes([ord("a") + i]) * 60)
    assert d.size == 192 and len(d.dynamic) == 2
    assert d.dynamic[0][1] == b"j" * 60  # newest first
    assert d.decode(b"\xbe") == [("name", "j" * 60)]  # index 62: the newest


@pytest.mark.parametrize(("block", "why"), [
    (b"\x80", "index 0"),
    (b"\xff\x00", "out of range"),  # index 127: nothing in the table
    (b"\x3f\xe2\x1f", "over the 4096 allowed"),  # size update beyond what we allowed
    (b"\x00\x81\x00", "padding"),  # a Huffman string of one zero byte: 8 bits of padding that are not ones
    (b"\x00\x84\xff\xff\xff\xff", "EOS"),  # 30 ones: EOS inside a string
    (b"\x00\x05ab", "truncated"),
])
def test_bad_blocks_are_refused(block: bytes, why: str) -> None:
    with pytest.raises(hpack.HpackError, match=why):
        hpack.Decoder().decode(block)


def test_what_the_encoder_writes_decodes_and_leaves_no_table() -> None:
    headers = [(":path", "/peloton.api.v1.JobService/GetJob"), ("grpc-timeout", "30000m"), ("x-long", "v" * 300)]
    d = hpack.Decoder()
    assert d.decode(hpack.encode(headers)) == headers
    assert d.size == 0


def test_every_byte_decodes_through_huffman() -> None:
    """The canonical code built from the lengths decodes every symbol (one string of all 256 bytes, encoded here
    with the same table)."""
    codes = {sym: (length, code) for (length, code), sym in hpack.huffman_codes().items()}
    bits = length = 0
    for sym in range(256):
        n, c = codes[sym]
        bits, length = (bits << n) | c, length + n
    pad = -length % 8
    bits, length = (bits << pad) | ((1 << pad) - 1), length + pad
    assert hpack.huffman_decode(bits.to_bytes(length // 8, "big")) == bytes(range(256))
    assert codes[ord("a")] == (5, 0x3) and codes[hpack.EOS] == (30, 0x3FFFFFFF)  # spot checks from the RFC
