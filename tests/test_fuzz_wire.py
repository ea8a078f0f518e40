"""Tier 1: the parse path never raises past the wire layer; bad input is
counted and logged at a bounded rate (issue 17)."""

from __future__ import annotations

import contextlib
import json
import logging
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trikernel.core.badinput import DETAIL_CHARS, BadInputLog, short
from trikernel.errors import ConfigError, ProtocolError
from trikernel.launch.config import KernelConfig
from trikernel.protocol import wire
from trikernel.protocol.messages import MessageBuilder as Session
from trikernel.protocol.wire import DELIM, Signer, WireLimits, deserialize, loads, serialize

KEY = b"fuzz-key"
PARTS = ("header", "parent_header", "metadata", "content")


def signed(parts: list[bytes], key: bytes = KEY) -> list[bytes]:
    return [DELIM, Signer(key).sign(parts), *parts]


def good_parts() -> list[bytes]:
    msg = Session().msg("kernel_info_request", {}, None)
    return [wire.dumps(msg.header), b"{}", b"{}", b"{}"]


def depth_of(v: object) -> int:
    if isinstance(v, dict):
        return 1 + max((depth_of(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((depth_of(x) for x in v), default=0)
    return 0


# ------------------------------------------------- the input that killed it


@pytest.mark.parametrize("part", range(4), ids=PARTS)
@pytest.mark.parametrize("depth", [985, 990, 100_000])
def test_regression_deep_array_in_each_part_is_a_protocol_error(part, depth):
    """Issue 17: a correctly signed message whose header, parent_header,
    metadata or content is `[[[...]]]` ~985 deep raised RecursionError out
    of deserialize, and the io run died."""
    parts = good_parts()
    parts[part] = b"[" * depth + b"]" * depth
    with pytest.raises(ProtocolError) as exc:
        deserialize(signed(parts), Signer(KEY))
    assert exc.value.kind == "too_deep"


@pytest.mark.parametrize(
    "text",
    [
        '{"x": ' + "[" * 985 + "]" * 985 + "}",
        '{"a":' * 985 + "1" + "}" * 985,
        '[{"a":' * 500 + "1" + "}]" * 500,
        '{"x": "' + "[" * 2000 + '", "y": ' + "[" * 129 + "]" * 129 + "}",
    ],
    ids=["inside-object", "objects", "mixed", "brackets-in-strings-then-deep"],
)
def test_deep_nesting_inside_objects_is_refused_before_parsing(text):
    with pytest.raises(ProtocolError) as exc:
        loads(text.encode())
    assert exc.value.kind == "too_deep"


def test_brackets_inside_strings_do_not_count():
    text = {"code": "[" * 5000 + '\\"[[' + "{" * 300, "k\\": "]]]]", "q": '"[[[[\\'}
    assert loads(json.dumps(text).encode()) == text


def test_depth_limit_is_exact_at_the_default():
    limit = wire.DEFAULT_LIMITS.max_json_depth
    assert loads(b"[" * limit + b"]" * limit) is not None
    with pytest.raises(ProtocolError):
        loads(b"[" * (limit + 1) + b"]" * (limit + 1))


json_tree = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\u00e9', max_size=6),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\k', max_size=4), kids, max_size=3)
    ),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(json_tree, st.integers(1, 12))
def test_depth_check_agrees_with_the_real_depth(value, limit):
    """Valid JSON within the limit always passes; deeper never does."""
    text = json.dumps(value, ensure_ascii=bool(limit % 2)).encode()
    if depth_of(value) <= limit:
        assert loads(text, limit) == value
    else:
        with pytest.raises(ProtocolError):
            loads(text, limit)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(json_tree, st.integers(1, 12), st.integers(1, 9))
def test_depth_check_agrees_when_strings_cross_the_cut_chunks(value, limit, chunk):
    """String literals are cut out a chunk at a time (wire._CUT_CHUNK, 16 KiB):
    with chunks of 1 to 9 bytes, literals, quotes and brackets fall on every
    side of a chunk boundary, and the check still agrees with the real depth."""
    text = json.dumps(value, ensure_ascii=bool(limit % 2)).encode()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wire, "_CUT_CHUNK", chunk)
        if depth_of(value) <= limit:
            assert loads(text, limit) == value
        else:
            with pytest.raises(ProtocolError):
                loads(text, limit)


@pytest.mark.parametrize(
    "text",
    [
        '{"a":' * 100_000 + "1" + "}" * 100_000,
        '[{"a":' * 50_000 + "1" + "}]" * 50_000,
        '{"x": "' + "[" * 200 + '", "y": ' + "[" * 100_000 + "]" * 100_000 + "}",
    ],
    ids=["objects", "mixed", "string-then-deep"],
)
def test_the_depth_pre_scan_needs_at_most_about_three_times_the_frame(text):
    """Issue 26: the pre-scan split a frame on every quote at once, one bytes
    object per string literal: a 100,000-deep ``{"a":{"a":...`` of 586 KiB
    took 13 MiB on the io thread (22x; 17x for the mixed one), whose heap
    glibc keeps (malloc_trim returns no thread arena's top): after the
    fuzzer's 100,000-deep frames the io thread's heap held 13 MiB. Now the
    literals are cut out a chunk at a time."""
    frame = memoryview(bytearray(text.encode()))  # as received: a view of libzmq's buffer
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError) as exc:
            loads(frame)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert exc.value.kind == "too_deep"
    assert peak < 3.5 * len(frame), f"{peak / len(frame):.1f} times the frame"


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet='[]{}"\\:,1a \u00e9', max_size=3000) | st.binary(max_size=200))
def test_loads_raises_only_protocol_errors(text):
    data = text.encode("utf-8") if isinstance(text, str) else text
    with contextlib.suppress(ProtocolError):
        loads(data, 8)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.binary(max_size=32) | st.sampled_from([DELIM, b"[" * 2000, b"{}", b"\xff"]), max_size=12))
def test_deserialize_raises_only_protocol_errors(frames):
    for key in (b"", KEY):
        try:
            deserialize(frames, Signer(key))
        except ProtocolError as exc:
            # it may also not raise, which pytest.raises cannot say
            assert exc.kind != "malformed"  # noqa: PT017 - every refusal says what was wrong


# ---------------------------------------------------- limits and odd input


def test_frame_count_and_size_limits_are_checked_before_the_signature():
    limits = WireLimits(max_frames=16, max_json_bytes=1 << 16, max_json_depth=8)
    parts = good_parts()
    with pytest.raises(ProtocolError) as exc:
        deserialize([*signed(parts), *[b"x"] * 11], Signer(KEY), limits)
    assert exc.value.kind == "too_many_frames"
    deserialize([*signed(parts), *[b"x"] * 10], Signer(KEY), limits)  # 16 frames: fine
    big = [*parts[:3], b'{"a": "' + b"x" * (1 << 16) + b'"}']
    with pytest.raises(ProtocolError) as exc:
        deserialize([DELIM, b"not even checked", *big], Signer(KEY), limits)
    assert exc.value.kind == "frame_too_large"


@pytest.mark.parametrize("text", [b'{"a": NaN}', b'{"a": [Infinity]}', b'{"a": -Infinity}'])
def test_nan_and_infinity_are_not_json(text):
    with pytest.raises(ProtocolError) as exc:
        loads(text)
    assert exc.value.kind == "invalid_json"


def test_invalid_utf8_becomes_replacement_characters_as_in_jupyter_client():
    assert loads(b'{"a": "caf\xff"}') == {"a": "caf\ufffd"}


def test_lone_surrogate_escapes_are_accepted_and_echo_safely():
    """JSON allows them (JavaScript produces them); stdlib json parses them,
    orjson would refuse. Echoed back they become U+FFFD, never an error."""
    content = loads(b'{"a": "\\ud800x"}')
    assert content == {"a": "\ud800x"}
    assert json.loads(wire.dumps(content)) == {"a": "\ufffdx"}


@pytest.mark.parametrize("value", ["2020-13-45T99:99:99", "2020-02-30T00:00:00Z", "0000-01-01T00:00:00"])
@pytest.mark.parametrize("field", ["date", "msg_id", "nested"])
def test_date_shaped_header_strings_that_are_no_date_are_refused(value, field):
    """jupyter_client's extract_dates raises on them in every client that
    reads the echoed parent_header on IOPub."""
    header = json.loads(good_parts()[0])
    if field == "nested":
        header["x"] = {"y": [value]}
    else:
        header[field] = value
    parts = [json.dumps(header).encode(), b"{}", b"{}", b"{}"]
    with pytest.raises(ProtocolError) as exc:
        deserialize(signed(parts), Signer(KEY))
    assert exc.value.kind == "bad_header"


@pytest.mark.parametrize(
    "value", ["2026-01-01T00:00:00.123456Z", "2026-01-01T00:00:00+0100", "2026-01-01T00:00:00+99:99"]
)
def test_real_dates_in_the_header_pass(value):
    header = {**json.loads(good_parts()[0]), "date": value}
    deserialize(signed([json.dumps(header).encode(), b"{}", b"{}", b"{}"]), Signer(KEY))


def test_huge_integers_are_refused_and_big_ones_echo():
    with pytest.raises(ProtocolError):
        loads(b'{"a": 1' + b"0" * 5000 + b"}")
    big = loads(b'{"a": 1' + b"0" * 30 + b"}")
    assert json.loads(wire.dumps(big)) == big  # orjson refuses > 64 bits; the stdlib path takes it


# ----------------------------------------------------------- the bad-input log


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_bad_input_log_is_bounded_first_with_detail_then_summaries(caplog):
    clock = FakeClock()
    bad = BadInputLog(10.0, logging.getLogger("test.badinput"), clock)
    caplog.set_level(logging.WARNING, "test.badinput")
    bad.record("shell", "bad_signature", "bad message signature")
    assert len(caplog.records) == 1
    assert "bad message signature" in caplog.text
    for i in range(10_000):
        bad.record("control" if i % 2 else "shell", "too_deep", "JSON nests deeper than 128 levels")
        clock.t += 0.001
    assert len(caplog.records) == 1  # counted, not logged
    bad.flush()
    assert len(caplog.records) == 2
    summary = caplog.records[-1].getMessage()
    assert "10000 more" in summary
    assert "control.too_deep 5000" in summary
    assert "shell.too_deep 5000" in summary
    bad.flush()  # nothing new: no line
    assert len(caplog.records) == 2
    clock.t += 60  # quiet for a while: the next one is logged with detail at once
    bad.record("stdin", "stray_input_reply", "an input_reply that answers no pending request")
    assert len(caplog.records) == 3
    assert "stray_input_reply" in caplog.records[-1].getMessage()
    stats = bad.statistics()
    assert stats.dropped == 10_002
    assert stats.by_kind["shell.too_deep"] == 5000
    assert stats.log_lines == 3


def test_short_keeps_peer_text_on_one_bounded_line():
    s = short("x\n" * 1000)
    assert "\n" not in s
    assert len(s) <= DETAIL_CHARS


# --------------------------------------------------------------- configuration


def test_limits_are_kernel_config_fields_with_cli_flags():
    from trikernel.launch.cli import _run_parser

    args = _run_parser().parse_args(
        [
            "-f",
            "x.json",
            "--max-frames",
            "99",
            "--max-json-bytes",
            "100000",
            "--max-json-depth",
            "40",
            "--max-topic-bytes",
            "10",
            "--bad-input-log-interval",
            "2.5",
        ]
    )
    cfg = KernelConfig(
        max_frames=args.max_frames, max_json_bytes=args.max_json_bytes, max_json_depth=args.max_json_depth
    )
    assert cfg.wire_limits == WireLimits(99, 100000, 40)
    assert (args.max_topic_bytes, args.bad_input_log_interval) == (10, 2.5)
    assert KernelConfig().wire_limits == wire.DEFAULT_LIMITS


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_frames", 3),
        ("max_json_bytes", 100),
        ("max_json_depth", 2),
        # past orjson's encoder limit, accepted content could not be encoded again
        ("max_json_depth", 255),
        ("bad_input_log_interval", 0),
        ("max_topic_bytes", -1),
    ],
)
def test_bad_limits_name_the_option(field, value):
    with pytest.raises(ConfigError, match="--" + field.replace("_", "-")):
        KernelConfig(**{field: value})


@pytest.mark.parametrize("limit", [wire.DEFAULT_LIMITS.max_json_depth, 254])
def test_serialize_of_everything_accepted_round_trips(limit):
    """What deserialize accepts re-encodes on the fast path: at the default
    depth (128) and at the largest ``--max-json-depth`` allowed (254,
    orjson's encoder limit)."""
    deep: object = 1
    for _ in range(limit - 1):
        deep = [deep]
    msg = Session().msg("comm_msg", {"data": deep}, None)
    limits = WireLimits(max_json_depth=limit)
    back = deserialize(serialize(msg, Signer(KEY)), Signer(KEY), limits)
    assert back.content == {"data": deep}
    orjson = pytest.importorskip("orjson")  # the fast path (the test extra brings it), no fallback
    assert orjson.loads(orjson.dumps(back.content)) == {"data": deep}
