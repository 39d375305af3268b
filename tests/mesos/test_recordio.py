"""RecordIO framing: bytes not str, arbitrary chunking, malformed lengths, and the recorded master's bytes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.hostmgr.mesos.recordio import RecordIODecoder, RecordIOError, encode
from tests.mesos.transcript_dir import transcript_files


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in points:
        out.append(data[prev:p])
        prev = p
    out.append(data[prev:])
    return out


payloads = st.one_of(
    st.binary(min_size=1, max_size=300),
    st.text(min_size=1, max_size=100).map(lambda s: json.dumps({"msg": s}, ensure_ascii=False).encode()),
    st.just("héllo \n ☃ 🚀 日本".encode()),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(payloads, min_size=1, max_size=12), st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_any_chunking_gives_the_same_records(records: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode(r) for r in records)
    dec = RecordIODecoder()
    got: list[bytes] = []
    for chunk in _split(stream, cuts):
        got += dec.feed(chunk)
    assert got == records
    assert dec.buffered == 0


@settings(max_examples=50, deadline=None)
@given(st.lists(payloads, min_size=1, max_size=5))
def test_byte_at_a_time(records: list[bytes]) -> None:
    stream = b"".join(encode(r) for r in records)
    dec = RecordIODecoder()
    got: list[bytes] = []
    for i in range(len(stream)):
        got += dec.feed(stream[i : i + 1])
    assert got == records


def test_length_counts_bytes_not_characters() -> None:
    payload = '{"message":"ünïcødé ☃"}'.encode()
    framed = encode(payload)
    assert framed.startswith(f"{len(payload)}\n".encode())
    assert len(payload) != len(payload.decode())
    assert RecordIODecoder().feed(framed + encode(b'{"type":"HEARTBEAT"}')) == [payload, b'{"type":"HEARTBEAT"}']


def test_no_newline_after_payload() -> None:
    assert RecordIODecoder().feed(b'3\nabc20\n{"type":"HEARTBEAT"}') == [b"abc", b'{"type":"HEARTBEAT"}']


@pytest.mark.parametrize("bad", [b"abc\n", b"-5\nxxxxx", b"\nabc", b"1 2\nx", b"12345678901234567890123\n", b"x", b"0\n",
                                 b"+3\nabc", b"3\r\nabc"])
def test_malformed_length_is_an_error(bad: bytes) -> None:
    dec = RecordIODecoder()
    with pytest.raises(RecordIOError, match="RecordIO"):
        dec.feed(bad)
    with pytest.raises(RecordIOError):  # poisoned: the stream cannot be resynchronised
        dec.feed(b"3\nabc")


def test_too_large_record() -> None:
    with pytest.raises(RecordIOError, match="exceeds"):
        RecordIODecoder(max_record=10).feed(b"11\n")


def test_partial_length_waits() -> None:
    dec = RecordIODecoder()
    assert dec.feed(b"1") == []
    assert dec.feed(b"0\n0123") == []
    assert dec.feed(b"456789") == [b"0123456789"]


def test_encode() -> None:
    assert encode(b'{"a":1}') == b'7\n{"a":1}'
    with pytest.raises(ValueError):
        encode(b"")


def test_recorded_master_bytes() -> None:
    """Re-framing the recorded events reproduces the master's bytes: the recorded lengths and the first bytes
    of each de-chunked JSON stream (the sample is a prefix, so the decoder must hold it back, not fail)."""
    checked = 0
    for path in transcript_files():  # fails the test when there are none
        with open(path) as f:
            exchanges = json.load(f)["exchanges"]
        for ex in exchanges:
            stream = ex["response"].get("stream")
            if not stream or ex["response"]["headers"].get("Content-Type") != "application/json":
                continue
            events = [r for r in stream["records"] if "event" in r]
            framed = b""
            for r in events:
                payload = json.dumps(r["event"], separators=(",", ":"), ensure_ascii=False).encode()
                if r["event"]["type"] != "UPDATE":  # (float timestamps are written with more digits)
                    assert len(payload) == r["length"], (path, r["event"]["type"])
                framed += encode(payload)
            raw = bytes.fromhex(stream.get("raw_sample_dechunked_hex", ""))
            if raw and events:
                first = len(encode(json.dumps(events[0]["event"], separators=(",", ":")).encode()))
                assert framed[: min(first, len(raw))] == raw[: min(first, len(raw))], path
                dec = RecordIODecoder()
                got: list[bytes] = []
                for i in range(0, len(raw), 7):  # 7-byte chunks
                    got += dec.feed(raw[i : i + 7])
                assert sum(len(encode(g)) for g in got) + dec.buffered <= len(raw)
                assert [json.loads(g) for g in got] == [r["event"] for r in events[: len(got)]]
                checked += 1
            dec = RecordIODecoder()
            assert [json.loads(x) for x in dec.feed(framed)] == [r["event"] for r in events]
    assert checked >= 10
