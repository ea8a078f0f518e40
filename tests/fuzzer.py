"""A fuzzer for Jupyter kernels: malformed traffic on all five sockets.

Shared by tests/test_fuzz.py (driven by hypothesis) and bench/fuzz.py (the
long run against trikernel, ipykernel and xeus-python). Kernel-neutral:
raw pyzmq clients and the connection file only.

Every generator takes a :class:`random.Random` and returns the frames of one
message for one channel; :data:`KINDS` maps a kind name to its generator and
the channels it applies to. Nothing generated can shut the kernel down or
block its sequential lane on purpose: a shutdown_request is only ever sent
in a form that must be dropped (bad signature, missing delimiter...), code
that is run is from :data:`SAFE_CODE`, and ``input()`` is only run with
``allow_stdin`` false.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

if TYPE_CHECKING:
    import os

DELIM = b"<IDS|MSG>"
MESSAGE_CHANNELS = ("shell", "control", "stdin")
ALL_CHANNELS = (*MESSAGE_CHANNELS, "iopub", "hb")

SHELL_REQUESTS = (
    "execute_request",
    "complete_request",
    "inspect_request",
    "history_request",
    "is_complete_request",
    "comm_open",
    "comm_msg",
    "comm_close",
    "comm_info_request",
    "kernel_info_request",
)
CONTROL_REQUESTS = ("kernel_info_request", "interrupt_request", "debug_request", "create_subshell_request")
STDIN_MESSAGES = ("input_reply",)
#: Code a fuzzed execute_request may run: quick, no shutdown, no blocking input.
SAFE_CODE = (
    "1+1",
    "pass",
    "",
    "x = 1",
    "print('fuzz')",
    "1/0",
    "import sys; sys.stderr.write('e')",
    "input('?')",  # only with allow_stdin false: StdinNotImplementedError
    "'\\udcff'",
    "%time 1",
    "def f(:",
    "x.",
    "a = [[[[[[[[[[1]]]]]]]]]]",
)


def _junk_text(rnd: random.Random, n: int = 12) -> str:
    alphabet = "abc XYZ_.()[]{}'\"\\\n\t\x00\x1b\u00e9\u4e2d\U0001f600"
    return "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, n)))


def json_junk(rnd: random.Random, depth: int = 0) -> Any:
    """A random JSON value: every type, odd strings, big and small numbers."""
    r = rnd.random()
    if depth > 3 or r < 0.5:
        return rnd.choice(
            [
                None,
                True,
                False,
                0,
                -1,
                2**63,
                -(2**64) - 1,
                10**40,
                1.5,
                -0.0,
                1e308,
                "",
                "x",
                _junk_text(rnd),
                "\udcff\ud800",
                "2020-13-45T99:99:99",
                "a" * rnd.randint(0, 300),
            ]
        )
    if r < 0.75:
        return [json_junk(rnd, depth + 1) for _ in range(rnd.randint(0, 4))]
    return {_junk_text(rnd, 6): json_junk(rnd, depth + 1) for _ in range(rnd.randint(0, 4))}


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=True).encode()


class Signer:
    def __init__(self, key: bytes, scheme: str = "hmac-sha256"):
        self.key = key
        self.digest = scheme.split("-", 1)[1]

    def sign(self, parts: list[bytes]) -> bytes:
        if not self.key:
            return b""
        return hmac.new(self.key, b"".join(parts), self.digest).hexdigest().encode()


class Fuzzer:
    """Generates fuzz messages for a kernel whose connection file is ``conn``."""

    def __init__(self, conn: dict[str, Any]):
        self.signer = Signer(conn["key"].encode(), conn.get("signature_scheme", "hmac-sha256"))
        self.session = uuid.uuid4().hex
        self.last_valid: list[bytes] | None = None
        self.counter = 0

    # -- building blocks ---------------------------------------------------
    def header(self, msg_type: str) -> dict[str, Any]:
        self.counter += 1
        return {
            "msg_id": f"fuzz-{self.session[:8]}-{self.counter}",
            "msg_type": msg_type,
            "username": "fuzz",
            "session": self.session,
            "date": "2026-01-01T00:00:00.000000Z",
            "version": "5.5",
        }

    def signed(self, parts: list[bytes], buffers: tuple[bytes, ...] = ()) -> list[bytes]:
        return [DELIM, self.signer.sign(parts), *parts, *buffers]

    def message(self, msg_type: str, content: Any, *, parent: Any = None, metadata: Any = None) -> list[bytes]:
        parts = [_dumps(self.header(msg_type)), _dumps(parent or {}), _dumps(metadata or {}), _dumps(content)]
        frames = self.signed(parts)
        if msg_type != "shutdown_request":
            self.last_valid = frames
        return frames

    def valid_content(self, rnd: random.Random, msg_type: str) -> dict[str, Any]:
        code = rnd.choice(SAFE_CODE)
        comm_id = uuid.UUID(int=rnd.getrandbits(128)).hex
        return {
            "execute_request": {
                "code": code,
                "silent": rnd.random() < 0.3,
                "store_history": rnd.random() < 0.5,
                "user_expressions": {"a": "1+1"},
                "allow_stdin": False,
                "stop_on_error": rnd.random() < 0.5,
            },
            "complete_request": {"code": code, "cursor_pos": len(code)},
            "inspect_request": {"code": code, "cursor_pos": len(code), "detail_level": rnd.choice([0, 1])},
            "history_request": {
                "hist_access_type": rnd.choice(["tail", "range", "search"]),
                "n": 3,
                "output": False,
                "raw": True,
                "session": 0,
                "start": 0,
                "stop": 2,
                "pattern": "*",
            },
            "is_complete_request": {"code": code},
            "comm_open": {"comm_id": comm_id, "target_name": rnd.choice(["fuzz", "jupyter.widget", ""]), "data": {}},
            "comm_msg": {"comm_id": comm_id, "data": {"method": "update", "state": {}}},
            "comm_close": {"comm_id": comm_id, "data": {}},
            "comm_info_request": rnd.choice([{}, {"target_name": "fuzz"}]),
            "kernel_info_request": {},
            "interrupt_request": {},
            # not initialize: that starts debugpy (its adapter process, pydevd's
            # memory and tracing), which tests/test_debugger.py covers; here the
            # kernel's RSS bound is about handling input
            "debug_request": {"seq": 1, "type": "request", "command": "debugInfo"},
            "create_subshell_request": {},
            "input_reply": {"value": _junk_text(rnd)},
        }.get(msg_type, {})

    # -- kinds -------------------------------------------------------------
    def k_valid(self, rnd: random.Random, channel: str) -> list[bytes]:
        t = self._type_for(rnd, channel)
        return self.message(t, self.valid_content(rnd, t))

    def _type_for(self, rnd: random.Random, channel: str) -> str:
        return rnd.choice({"shell": SHELL_REQUESTS, "control": CONTROL_REQUESTS, "stdin": STDIN_MESSAGES}[channel])

    def k_bad_content(self, rnd: random.Random, channel: str) -> list[bytes]:
        """A correctly signed request whose content fields are garbage."""
        t = self._type_for(rnd, channel)
        content = self.valid_content(rnd, t)
        for key in list(content):
            roll = rnd.random()
            if roll < 0.3:
                del content[key]
            elif roll < 0.8:
                content[key] = json_junk(rnd)
        if rnd.random() < 0.3:
            content[_junk_text(rnd, 5)] = json_junk(rnd)
        if t == "execute_request":
            if not isinstance(content.get("code"), str) or rnd.random() < 0.5:
                content["code"] = rnd.choice(SAFE_CODE) if rnd.random() < 0.5 else content.get("code")
            if isinstance(content.get("code"), str) and content["code"] not in SAFE_CODE:
                content["code"] = "pass"
            if "input" in str(content.get("code")):
                content["allow_stdin"] = False
        return self.message(t, content)

    def k_random_frames(self, rnd: random.Random, channel: str) -> list[bytes]:
        return [rnd.randbytes(rnd.randint(0, 64)) for _ in range(rnd.randint(0, 8))]

    def k_no_delimiter(self, rnd: random.Random, channel: str) -> list[bytes]:
        frames = self.message(self._type_for(rnd, channel), {})
        return [f for f in frames if f != DELIM]

    def k_few_frames(self, rnd: random.Random, channel: str) -> list[bytes]:
        frames = self.message(self._type_for(rnd, channel), {})
        return frames[: rnd.randint(1, 5)]

    def k_bad_signature(self, rnd: random.Random, channel: str) -> list[bytes]:
        t = rnd.choice([self._type_for(rnd, channel), "shutdown_request"])
        frames = self.message(t, {"restart": json_junk(rnd)} if t == "shutdown_request" else {})
        sig = rnd.choice(
            [
                rnd.randbytes(32).hex().encode(),
                frames[1][:-1],
                frames[1].upper(),
                b"",
                rnd.randbytes(64),
                hmac.new(b"wrong key", b"".join(frames[2:6]), hashlib.sha256).hexdigest().encode(),
            ]
        )
        return [DELIM, sig, *frames[2:]]

    def k_replayed(self, rnd: random.Random, channel: str) -> list[bytes]:
        if self.last_valid is None:
            return self.k_valid(rnd, channel)
        return list(self.last_valid)

    def _part_attack(self, rnd: random.Random, channel: str, bad: bytes, *, which: int | None = None) -> list[bytes]:
        t = self._type_for(rnd, channel)
        parts = [_dumps(self.header(t)), b"{}", b"{}", _dumps(self.valid_content(rnd, t))]
        parts[rnd.randrange(4) if which is None else which] = bad
        return self.signed(parts)

    def k_invalid_json(self, rnd: random.Random, channel: str) -> list[bytes]:
        bad = rnd.choice(
            [
                b"{",
                b"{nope",
                b'{"a": 1,}',
                b"",
                rnd.randbytes(rnd.randint(1, 40)),
                b'{"a": NaN}',
                b'{"a": Infinity}',
                b'{"a": 1' + b"0" * 5000 + b"}",
                b'{"a": "\x01"}',
                b'{"a": 1} trailing',
                b'{"a"' * 50,
            ]
        )
        return self._part_attack(rnd, channel, bad)

    def k_not_object(self, rnd: random.Random, channel: str) -> list[bytes]:
        bad = rnd.choice([b"[]", b"null", b"1", b'"s"', b"true", b"[{}]"])
        return self._part_attack(rnd, channel, bad)

    def k_missing_fields(self, rnd: random.Random, channel: str) -> list[bytes]:
        h = self.header(self._type_for(rnd, channel))
        for key in rnd.sample(sorted(h), rnd.randint(1, 3)):
            if rnd.random() < 0.5:
                del h[key]
            else:
                h[key] = json_junk(rnd)
        return self._part_attack(rnd, channel, _dumps(h), which=0)

    def k_deep(self, rnd: random.Random, channel: str) -> list[bytes]:
        """The input that killed trikernel: arrays/objects ~985 (or far more) deep."""
        depth = rnd.choice([129, 500, 985, 990, 2000, 100_000])
        style = rnd.choice(["array", "object", "mixed", "inside"])
        if style == "array":
            text = "[" * depth + "]" * depth
        elif style == "object":
            text = '{"a":' * depth + "1" + "}" * depth
        elif style == "mixed":
            text = '[{"a":' * (depth // 2) + "1" + "}]" * (depth // 2)
        else:
            text = '{"x": ' + "[" * depth + "]" * depth + "}"
        return self._part_attack(rnd, channel, text.encode())

    def k_non_utf8(self, rnd: random.Random, channel: str) -> list[bytes]:
        t = self._type_for(rnd, channel)
        content = self.valid_content(rnd, t)
        raw = _dumps(content)
        junk = rnd.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf0\x28\x8c\x28", b"\x80"])
        bad = raw.replace(b'"', b'"' + junk, 1) if b'"' in raw else b'{"a": "' + junk + b'"}'
        return self._part_attack(rnd, channel, bad, which=3)

    def k_surrogates(self, rnd: random.Random, channel: str) -> list[bytes]:
        t = self._type_for(rnd, channel)
        s = rnd.choice(["\ud800", "\udfff", "x\udcffy", "\ud83d"])
        content = self.valid_content(rnd, t)
        for key in content:
            if isinstance(content[key], str) and rnd.random() < 0.7:
                content[key] = s if key != "code" else rnd.choice([s, repr(s)])
        if rnd.random() < 0.3:
            content[s] = s
        h = self.header(t)
        if rnd.random() < 0.3:
            h["username"] = s
        return self.signed([_dumps(h), b"{}", _dumps({s: s}) if rnd.random() < 0.3 else b"{}", _dumps(content)])

    def k_huge(self, rnd: random.Random, channel: str) -> list[bytes]:
        """Over the limits (dropped unparsed: a JSON frame of 64 MiB + 1, 5000 or
        50,000 frames) or big but within them (1 MiB of JSON or buffers)."""
        t = self._type_for(rnd, channel)
        roll = rnd.random()
        if roll < 0.4:  # a big JSON string in content
            size = rnd.choice([1 << 20, (64 << 20) + 1])
            bad = b'{"blob": "' + b"a" * size + b'"}'
            return self._part_attack(rnd, channel, bad, which=3)
        if roll < 0.7:  # big buffers
            parts = [_dumps(self.header(t)), b"{}", b"{}", _dumps(self.valid_content(rnd, t))]
            return self.signed(parts, (b"\0" * (1 << 20),) * rnd.randint(1, 2))
        return [*self.message(t, {})[:6], *([b"b"] * rnd.choice([5000, 50_000]))]  # many frames

    def k_date_poison(self, rnd: random.Random, channel: str) -> list[bytes]:
        h = self.header(self._type_for(rnd, channel))
        h[rnd.choice(["date", "msg_id", "session", "extra"])] = rnd.choice(
            ["2020-13-45T99:99:99", "2020-02-30T00:00:00Z", "0000-01-01T00:00:00"]
        )
        return self._part_attack(rnd, channel, _dumps(h), which=0)

    def k_shutdown_garbage(self, rnd: random.Random, channel: str) -> list[bytes]:
        """shutdown_request with restart garbage, always in a form that is dropped."""
        frames = self.message("shutdown_request", {"restart": json_junk(rnd)})
        return rnd.choice([[DELIM, b"0" * 64, *frames[2:]], frames[1:], frames[:4], [DELIM, b"", *frames[2:]]])

    # -- iopub and hb ----------------------------------------------------
    def k_subscription(self, rnd: random.Random, channel: str) -> list[bytes]:
        first = rnd.choice([b"\x01", b"\x00", b"\x02", b"", b"\xff"])
        topic = rnd.choice([b"", b"kernel.", rnd.randbytes(rnd.randint(0, 40)), b"t" * 2000, b"\xff\xfe"])
        frames = [first + topic]
        if rnd.random() < 0.2:
            frames.append(rnd.randbytes(8))
        return frames

    def k_long_subscription(self, rnd: random.Random, channel: str) -> list[bytes]:
        """A subscription around and far past --max-topic-bytes (issue 26.1), sent by a
        new subscriber of its own (:data:`NEW_SUBSCRIBER`): 1024 is welcomed, 1025-1033
        reach libzmq without a welcome (a ZMTP 3.0 frame), 1034 on cost the connection."""
        size = rnd.choice([1024, 1025, 1033, 1034, 4096, 1 << 16, 1 << 16])
        return [b"\x01" + rnd.randbytes(size)]

    def k_hb_bytes(self, rnd: random.Random, channel: str) -> list[bytes]:
        return [rnd.randbytes(rnd.choice([0, 1, 8, 1000, 1 << 16])) for _ in range(rnd.randint(1, 3))]


Generator = Callable[[Fuzzer, random.Random, str], list[bytes]]
#: kind -> (generator, channels it is sent on)
KINDS: dict[str, tuple[Generator, tuple[str, ...]]] = {
    "valid": (Fuzzer.k_valid, MESSAGE_CHANNELS),
    "bad_content": (Fuzzer.k_bad_content, MESSAGE_CHANNELS),
    "random_frames": (Fuzzer.k_random_frames, MESSAGE_CHANNELS),
    "no_delimiter": (Fuzzer.k_no_delimiter, MESSAGE_CHANNELS),
    "few_frames": (Fuzzer.k_few_frames, MESSAGE_CHANNELS),
    "bad_signature": (Fuzzer.k_bad_signature, MESSAGE_CHANNELS),
    "replayed": (Fuzzer.k_replayed, MESSAGE_CHANNELS),
    "invalid_json": (Fuzzer.k_invalid_json, MESSAGE_CHANNELS),
    "not_object": (Fuzzer.k_not_object, MESSAGE_CHANNELS),
    "missing_fields": (Fuzzer.k_missing_fields, MESSAGE_CHANNELS),
    "deep": (Fuzzer.k_deep, MESSAGE_CHANNELS),
    "non_utf8": (Fuzzer.k_non_utf8, MESSAGE_CHANNELS),
    "surrogates": (Fuzzer.k_surrogates, MESSAGE_CHANNELS),
    "huge": (Fuzzer.k_huge, MESSAGE_CHANNELS),
    "date_poison": (Fuzzer.k_date_poison, MESSAGE_CHANNELS),
    "shutdown_garbage": (Fuzzer.k_shutdown_garbage, ("shell", "control")),
    "subscription": (Fuzzer.k_subscription, ("iopub",)),
    "long_subscription": (Fuzzer.k_long_subscription, ("iopub+",)),
    "hb_bytes": (Fuzzer.k_hb_bytes, ("hb",)),
}
#: kinds that cost the kernel real work per message (kept rarer in long runs)
HEAVY = frozenset({"huge"})


#: The pseudo-channel of :meth:`Peers.send` that sends on a new IOPub connection.
NEW_SUBSCRIBER = "iopub+"
#: New IOPub connections :class:`Peers` keeps open at most; the oldest is closed past it.
MAX_SUBSCRIBERS = 20
#: Subshells a :class:`Peers` given a fuzzer keeps at most; past it the oldest is deleted.
MAX_SUBSHELLS = 20


class Peers:
    """Raw pyzmq sockets on all five channels; sends frames, drains replies.

    DEALER on shell/control/stdin/hb, XSUB on iopub (it may send any frame
    upstream). Everything the kernel sends back is read and thrown away, so
    the fuzzer is never a slow subscriber. :data:`NEW_SUBSCRIBER` sends on a
    new XSUB of its own instead, kept open among the last
    :data:`MAX_SUBSCRIBERS` (subscribers come and go, as in issue 26.1).

    Given ``fuzzer``, subshells come and go too: each ``create_subshell_reply``
    read on control is noted, and past :data:`MAX_SUBSHELLS` the oldest is
    deleted (a signed ``delete_subshell_request``, counted in
    :attr:`subshells_deleted`). A subshell is a thread with a trio run that a
    keyed client asked for, about 90 KiB of RSS each and kept until deleted,
    as ipykernel keeps them: without this a 300 s run leaves ~2,000 and the
    kernel's RSS measures the harness, not the handling of input.
    """

    def __init__(self, conn: dict[str, Any], ctx: zmq.Context[Any] | None = None, fuzzer: Fuzzer | None = None):
        self.ctx = ctx or zmq.Context()
        self.fuzzer = fuzzer
        self.subshells: list[str] = []
        self.subshells_deleted = 0
        self._awaited: set[str] = set()  # msg_ids of wait_answered's requests not yet answered
        self.socks: dict[str, zmq.Socket[Any]] = {}
        ip, transport = conn.get("ip", "127.0.0.1"), conn.get("transport", "tcp")
        for ch in ALL_CHANNELS:
            s = self.ctx.socket(zmq.XSUB if ch == "iopub" else zmq.DEALER)
            s.linger = 0
            s.sndhwm = 0
            s.rcvhwm = 0
            s.connect(f"{transport}://{ip}:{conn[ch + '_port']}")
            self.socks[ch] = s
        self.received = Counter[str]()
        self.poller = zmq.Poller()
        for s in self.socks.values():
            self.poller.register(s, zmq.POLLIN)
        self._iopub_url = f"{transport}://{ip}:{conn['iopub_port']}"
        self.subscribers: list[zmq.Socket[Any]] = []

    def send(self, channel: str, frames: list[bytes]) -> None:
        if not frames:
            frames = [b""]
        if channel == NEW_SUBSCRIBER:
            self._send_new_subscriber(frames)
            return
        self.socks[channel].send_multipart(frames, copy=len(frames) < 16)
        self.drain(0)

    def _send_new_subscriber(self, frames: list[bytes]) -> None:
        s = self.ctx.socket(zmq.XSUB)
        s.linger = 0
        s.sndhwm = 0
        s.rcvhwm = 1  # it never reads: the kernel's SNDHWM and the fallback handle it
        s.connect(self._iopub_url)
        s.send_multipart(frames)
        self.subscribers.append(s)
        if len(self.subscribers) > MAX_SUBSCRIBERS:
            self.subscribers.pop(0).close(0)

    def drain(self, timeout_ms: int = 0) -> None:
        for sock, _ in self.poller.poll(timeout_ms):
            ch = next(k for k, v in self.socks.items() if v is sock)
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    self.received[ch] += 1
                except zmq.Again:
                    break
                if ch in ("shell", "control") and self.fuzzer is not None:
                    self._note_reply(ch, [f.bytes for f in frames])

    def wait_answered(self, timeout: float) -> bool:
        """Send a kernel_info_request on shell and on control and read until both
        are answered: everything sent before on those sockets has then been
        served (each is served in order). Needs ``fuzzer``. Whether both came
        within ``timeout`` seconds.

        Without it the fuzzer is open-loop: a burst goes out whether the last
        one was served or not, and what the kernel is behind by piles up in
        its receive queues (up to RCVHWM messages per socket and peer, the
        fuzzer's big frames among them), so the kernel's RSS would measure
        how far behind it is, not what handling the input costs.
        """
        assert self.fuzzer is not None
        for ch in ("shell", "control"):
            frames = self._request("kernel_info_request", {})
            self._awaited.add(json.loads(frames[2])["msg_id"])
            self.socks[ch].send_multipart(frames)
        deadline = time.monotonic() + timeout
        while self._awaited and time.monotonic() < deadline:
            self.drain(50)
        answered = not self._awaited
        self._awaited.clear()
        return answered

    def _note_reply(self, channel: str, frames: list[bytes]) -> None:
        """A reply on shell or control: one :meth:`wait_answered` waits for, or a
        create_subshell_reply (keep its id; delete the oldest past :data:`MAX_SUBSHELLS`)."""
        assert self.fuzzer is not None
        try:
            i = frames.index(DELIM)
            if self._awaited:
                self._awaited.discard(json.loads(frames[i + 3]).get("msg_id"))
            if channel != "control" or b"create_subshell_reply" not in frames[i + 2]:
                return
            sid = json.loads(frames[i + 5]).get("subshell_id")
        except (ValueError, IndexError, AttributeError, TypeError):
            return
        if not isinstance(sid, str):
            return
        self.subshells.append(sid)
        if len(self.subshells) > MAX_SUBSHELLS:
            content = {"subshell_id": self.subshells.pop(0)}
            self.socks["control"].send_multipart(self._request("delete_subshell_request", content))
            self.subshells_deleted += 1

    def _request(self, msg_type: str, content: dict[str, Any]) -> list[bytes]:
        """A signed request of the harness's own (not what ``replayed`` replays)."""
        assert self.fuzzer is not None
        f = self.fuzzer
        return f.signed([_dumps(f.header(msg_type)), b"{}", b"{}", _dumps(content)])

    def settle(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.drain(50)

    def close(self) -> None:
        for s in [*self.socks.values(), *self.subscribers]:
            s.close(0)


def pick(rnd: random.Random, kinds: tuple[str, ...] | None = None, heavy_weight: float = 0.02) -> tuple[str, str]:
    """A (kind, channel) pair; heavy kinds drawn with ``heavy_weight``."""
    names = kinds or tuple(KINDS)
    weights = [heavy_weight if k in HEAVY else 1.0 for k in names]
    kind = rnd.choices(names, weights)[0]
    return kind, rnd.choice(KINDS[kind][1])


def generate(fuzzer: Fuzzer, rnd: random.Random, kind: str, channel: str) -> list[bytes]:
    return KINDS[kind][0](fuzzer, rnd, channel)


def load_connection(path: str | os.PathLike[str]) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return dict(json.load(f))
