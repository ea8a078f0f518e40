"""Tier 1: the sans-I/O wire protocol (messaging spec, "The Wire Protocol")."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trikernel.errors import ConfigError, ProtocolError
from trikernel.protocol import wire
from trikernel.protocol.messages import MessageBuilder as Session
from trikernel.protocol.wire import DELIM, Message, Signer, deserialize, serialize

KEY = b"secret-key"


def test_round_trip_with_identities_and_buffers():
    s = Signer(KEY)
    msg = Session().msg(
        "comm_msg", {"comm_id": "c", "data": {"x": 1}}, None, buffers=(b"\x00\x01", b"zz"), identities=(b"id1", b"id2")
    )
    frames = serialize(msg, s)
    assert frames[:3] == [b"id1", b"id2", DELIM]
    back = deserialize(frames, Signer(KEY))
    assert back.header == msg.header
    assert back.content == msg.content
    assert back.buffers == (b"\x00\x01", b"zz")
    assert back.identities == (b"id1", b"id2")


def test_signature_is_hmac_of_the_four_json_frames():
    s = Signer(KEY, "hmac-sha512")
    frames = serialize(Session().msg("status", {"execution_state": "idle"}, None), s)
    parts = frames[2:6]
    assert frames[1] == hmac.new(KEY, b"".join(parts), hashlib.sha512).hexdigest().encode()


@pytest.mark.parametrize("scheme", ["hmac-md5", "hmac-sha1", "hmac-sha256", "hmac-sha512", "hmac-sha3_256"])
def test_other_hashlib_schemes(scheme):
    s = Signer(KEY, scheme)
    frames = serialize(Session().msg("x", {}, None), s)
    deserialize(frames, Signer(KEY, scheme))


@pytest.mark.parametrize("scheme", ["sha256", "hmac-nope"])
def test_bad_scheme_names_the_field(scheme):
    with pytest.raises(ConfigError, match="signature_scheme"):
        Signer(KEY, scheme)


def test_bad_and_missing_signature_and_replay_are_rejected():
    frames = serialize(Session().msg("kernel_info_request", {}, None), Signer(KEY))
    with pytest.raises(ProtocolError, match="bad message signature"):
        deserialize([DELIM, b"0" * 64, *frames[2:]], Signer(KEY))
    with pytest.raises(ProtocolError, match="unsigned"):
        deserialize([DELIM, b"", *frames[2:]], Signer(KEY))
    v = Signer(KEY)
    deserialize(frames, v)
    with pytest.raises(ProtocolError, match="replayed"):
        deserialize(frames, v)


def test_replay_window_is_bounded():
    v = Signer(KEY, replay_window=3)
    session = Session()
    sent = [serialize(session.msg("x", {}, None), Signer(KEY)) for _ in range(10)]
    for frames in sent:
        deserialize(frames, v)
    assert len(v._seen) == len(v._order) == 3
    with pytest.raises(ProtocolError, match="replayed"):
        deserialize(sent[-1], v)  # remembered
    deserialize(sent[0], v)  # forgotten: past the window


def test_replay_guard_keeps_less_than_a_signature_per_message():
    """The guard is full after 65,536 accepted messages (a long fuzz run
    fills it): it used to keep each signature frame (64 hex digits, 112
    bytes) in an OrderedDict, about 200 bytes a message, 12.5 MiB in all;
    128 bits of it as an int in a set, oldest first in a deque, is about 85
    (issue 26, docs/robustness.md "Memory of dropped input")."""
    guard, signer = Signer(KEY), Signer(KEY)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(wire.REPLAY_WINDOW + 1000):  # each signature frame dropped once remembered
            guard.remember(signer.sign([str(i).encode(), b"{}", b"{}", b"{}"]))
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(guard._seen) == wire.REPLAY_WINDOW
    assert kept / wire.REPLAY_WINDOW < 128, f"{kept / wire.REPLAY_WINDOW:.0f} bytes per remembered signature"


def test_empty_key_means_no_signing():
    frames = serialize(Session().msg("x", {}, None), Signer(b""))
    assert frames[1] == b""
    deserialize(frames, Signer(b""))


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        ([b"a", b"b"], "delimiter"),
        ([DELIM, b"", b"{}", b"{}"], ">= 5 frames"),
        ([DELIM, b"", b"{", b"{}", b"{}", b"{}"], "not valid JSON"),
        ([DELIM, b"", b"[]", b"{}", b"{}", b"{}"], "not a JSON object"),
        ([DELIM, b"", b'{"msg_id": "x"}', b"{}", b"{}", b"{}"], "msg_type"),
        ([DELIM, b"", b'{"msg_type": "x", "msg_id": 5}', b"{}", b"{}", b"{}"], "msg_id"),
        ([DELIM, b"", b"\xff\xfe", b"{}", b"{}", b"{}"], "not valid JSON"),
    ],
)
def test_malformed_frames(frames, match):
    with pytest.raises(ProtocolError, match=match):
        deserialize(frames, Signer(b""))


def test_reply_routes_to_sender_and_names_type():
    session = Session()
    req = Message({"msg_id": "1", "msg_type": "complete_request", "session": "s"}, identities=(b"peer",))
    rep = session.reply(req, {"status": "ok"})
    assert rep.msg_type == "complete_reply"
    assert rep.identities == (b"peer",)
    assert rep.parent_header["msg_id"] == "1"
    assert rep.header["version"] == "5.5"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=10))
def test_fuzz_arbitrary_frames_never_crash(frames):
    """Any frames give a Message or a ProtocolError, never another exception."""
    with contextlib.suppress(ProtocolError):
        deserialize(frames, Signer(KEY))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=10), json_values, max_size=6))
def test_fuzz_content_round_trips(content):
    msg = Session().msg("x", content, None)
    back = deserialize(serialize(msg, Signer(KEY)), Signer(KEY))
    assert back.content == json.loads(json.dumps(content))


def test_frames_received_as_views_parse_like_bytes_and_are_not_copied():
    """The server hands frames over 64 KiB as memoryviews of libzmq's buffer
    (server/sockets.py): a message of views parses to the same message,
    its HMAC (fed frame by frame past 64 KiB) is the same, its buffers stay
    the views they were, and an oversize JSON view is refused unread."""
    big = "x" * (1 << 17)
    msg = Session().msg("comm_msg", {"comm_id": "c", "data": {"s": big}}, None, buffers=(b"\0" * (1 << 17), b"zz"))
    frames = serialize(msg, Signer(KEY))
    assert frames[1] == hmac.new(KEY, b"".join(frames[2:6]), hashlib.sha256).hexdigest().encode()
    views: list[bytes | memoryview] = [memoryview(f) if len(f) > 1 << 16 else f for f in frames]
    assert any(isinstance(v, memoryview) for v in views[2:6])
    back = deserialize(views, Signer(KEY))
    assert back.content == msg.content
    assert back.header == msg.header
    assert isinstance(back.buffers[0], memoryview)
    assert back.buffers[0].obj is frames[6]  # the received buffer itself, not a copy
    assert back.buffers == (b"\0" * (1 << 17), b"zz")
    with pytest.raises(ProtocolError) as exc:  # a view with no key: the signature frame is not looked at either
        deserialize([DELIM, memoryview(b"s" * (1 << 17)), *views[2:5], memoryview(b"{" * (65 << 20))], Signer(b""))
    assert exc.value.kind == "frame_too_large"
    with pytest.raises(ProtocolError) as exc:  # a long bad signature: refused without a copy
        deserialize([DELIM, memoryview(b"s" * (1 << 17)), *views[2:6]], Signer(KEY))
    assert exc.value.kind == "bad_signature"
