"""The suite's own client: raw pyzmq sockets, every received message audited.

jupyter_client's clients hide what a conformance suite must see (the raw
signature, the date string before it is parsed, a second reply to a
replayed request) and cannot send what it must send (a badly signed or
replayed message). :class:`Channels` speaks the wire protocol itself:

- shell and control DEALERs, a stdin DEALER with the shell's identity (spec
  "Messages on the stdin channel": the input_request is routed by it), the
  IOPub SUB(s) and a heartbeat REQ, all connected to one kernel;
- :meth:`Channels.pump` reads whatever arrived on any socket, parses it,
  hands it to the :class:`~.audit.Audit` (every-message checks) and files it
  by parent ``msg_id``; every wait (``wait``, ``reply``, ``until_idle``) has
  a deadline and raises :class:`Timeout`, a :class:`Fail`, when it passes.

Runs on the caller's thread only (blocking pyzmq, no event loop); one
Channels per kernel process, closed with :meth:`close`.

Spec: messaging "The Wire Protocol", "General Message Format".
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import zmq

from trikernel.conformance.received import Received
from trikernel.conformance.verdict import Fail

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from trikernel.conformance.audit import Audit

T = TypeVar("T")
DELIM = b"<IDS|MSG>"
#: Protocol version the suite's own requests declare.
CLIENT_VERSION = "5.5"
CHANNEL_TYPES = {"shell": zmq.DEALER, "control": zmq.DEALER, "stdin": zmq.DEALER, "iopub": zmq.SUB, "hb": zmq.REQ}


class Timeout(Fail):
    """A deadline passed while waiting for the kernel (a FAIL, with what was awaited)."""


def now_iso() -> str:
    """The header date as jupyter_client writes it (UTC, ``Z``)."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def is_idle(msg: Received) -> bool:
    """Whether ``msg`` is a ``status`` message with ``execution_state`` "idle" (messaging spec
    "Kernel status")."""
    return msg.msg_type == "status" and msg.content.get("execution_state") == "idle"


def is_busy(msg: Received) -> bool:
    """Whether ``msg`` is a ``status`` message with ``execution_state`` "busy" (messaging spec
    "Kernel status")."""
    return msg.msg_type == "status" and msg.content.get("execution_state") == "busy"


class Signer:
    """HMAC of the four JSON frames (spec "The Wire Protocol")."""

    def __init__(self, key: bytes, scheme: str):
        self.key = key
        self.digest = getattr(hashlib, scheme.split("-", 1)[1])

    def sign(self, parts: Iterable[bytes]) -> bytes:
        """The hex HMAC of ``parts`` (header, parent_header, metadata and content frames, in that
        order) as ASCII bytes; ``b""`` when the key is empty (signing off). Messaging spec
        "The Wire Protocol"."""
        if not self.key:
            return b""
        h = hmac.new(self.key, digestmod=self.digest)
        for p in parts:
            h.update(p)
        return h.hexdigest().encode()


def dumps(obj: Any) -> bytes:
    """``obj`` as a UTF-8 JSON frame (non-ASCII kept as is, as jupyter_client's Session writes
    it)."""
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


class Channels:
    """Sockets to one kernel, the audit of what it sends, and waits with deadlines.

    ``info``: the kernel's connection info (``KernelManager.get_connection_info()``:
    ``ip``, ``transport``, the five ``*_port``, ``key`` as bytes,
    ``signature_scheme``, optional ``curve_publickey``/``curve_secretkey``).
    """

    def __init__(self, info: Mapping[str, Any], audit: Audit, context: zmq.Context[Any]):
        self.info = dict(info)
        key = self.info.get("key", b"")
        self.key: bytes = key.encode() if isinstance(key, str) else bytes(key)
        self.signer = Signer(self.key, str(self.info.get("signature_scheme", "hmac-sha256")))
        self.audit = audit
        self.context = context
        self.session = uuid.uuid4().hex
        self.identity = f"conformance-{uuid.uuid4().hex[:12]}".encode()
        self.sockets: dict[str, zmq.Socket[Any]] = {}
        self._monitors: dict[str, zmq.Socket[Any]] = {}
        self.channel_of: dict[str, str] = {}
        self.poller = zmq.Poller()
        self.sent: dict[str, dict[str, Any]] = {}
        self.by_parent: dict[str, list[Received]] = {}
        self.orphans: dict[str, list[Received]] = {}
        self.sinks: dict[str, Callable[[Received], bool]] = {}
        self.seq = 0
        #: Messages received per socket label (whatever their parent).
        self.received: dict[str, int] = {}
        for name in ("shell", "control", "stdin"):
            ident = self.identity if name in ("shell", "stdin") else None
            self._open(name, name, identity=ident)
        self.subscribe("iopub")
        self._hb: zmq.Socket[Any] | None = None

    # -- sockets -------------------------------------------------------------
    def url(self, channel: str) -> str:
        """The ZeroMQ endpoint of ``channel`` ("shell", "iopub", "hb", ...) from the connection
        info: ``tcp://ip:port``, or ``ipc://ip-port`` for transport "ipc" (kernels.rst
        "Connection files"). Raises KeyError when the info has no ``<channel>_port``."""
        ip = self.info.get("ip", "127.0.0.1")
        port = self.info[f"{channel}_port"]
        if self.info.get("transport", "tcp") == "ipc":
            return f"ipc://{ip}-{port}"
        return f"tcp://{ip}:{port}"

    def _open(
        self, label: str, channel: str, identity: bytes | None = None, rcvhwm: int | None = None
    ) -> zmq.Socket[Any]:
        sock: zmq.Socket[Any] = self.context.socket(CHANNEL_TYPES[channel])
        sock.linger = 0
        if identity:
            sock.identity = identity
        if rcvhwm is not None:
            sock.rcvhwm = rcvhwm
        pub, sec = self.info.get("curve_publickey"), self.info.get("curve_secretkey")
        if pub and sec:  # as jupyter_client's clients do: the server keypair, server key pinned
            pk = pub.encode() if isinstance(pub, str) else pub
            sk = sec.encode() if isinstance(sec, str) else sec
            sock.curve_secretkey, sock.curve_publickey, sock.curve_serverkey = sk, pk, pk
        if channel == "iopub":
            sock.setsockopt(zmq.SUBSCRIBE, b"")
        if channel in ("shell", "control", "stdin"):
            self._monitors[label] = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        sock.connect(self.url(channel))
        if channel != "hb":
            self.sockets[label] = sock
            self.channel_of[label] = channel
            self.poller.register(sock, zmq.POLLIN)
        return sock

    def wait_connected(self, timeout: float, alive: Callable[[], bool] | None = None) -> None:
        """Block until the shell, control and stdin DEALERs have finished the
        ZMTP handshake with the kernel (a ROUTER drops what it sends to an
        identity not yet connected: an input_request sent before the stdin
        DEALER is connected is lost). Raises Timeout after ``timeout`` s, or
        Fail as soon as ``alive()`` says the kernel is gone."""
        deadline = time.monotonic() + timeout
        for label, mon in list(self._monitors.items()):
            while not mon.poll(100):
                if alive is not None and not alive():
                    raise Fail(f"{label}: the kernel is gone before it accepted a connection")
                if time.monotonic() > deadline:
                    raise Timeout(f"{label}: not connected to the kernel within {timeout:g} s")
            mon.recv_multipart()
            self.sockets[label].disable_monitor()
            mon.close(linger=0)
            del self._monitors[label]

    def subscribe(self, label: str, *, rcvhwm: int | None = None, register: bool = True) -> zmq.Socket[Any]:
        """A new IOPub SUB (subscribed to everything) named ``label``.

        ``register=False`` leaves it out of :meth:`pump` (a subscriber that
        is not reading); read it later with :meth:`register`.
        """
        sock = self._open(label, "iopub", rcvhwm=rcvhwm)
        if not register:
            self.poller.unregister(sock)
        return sock

    def register(self, label: str) -> None:
        """Read socket ``label`` in :meth:`pump` again."""
        self.poller.register(self.sockets[label], zmq.POLLIN)

    def unregister(self, label: str) -> None:
        """Stop reading socket ``label`` in :meth:`pump` (it keeps its queue)."""
        self.poller.unregister(self.sockets[label])

    def close_socket(self, label: str) -> None:
        """Unregister and close the socket labelled ``label`` (LINGER 0), forgetting it; a label
        with no socket is ignored. Messages already filed stay filed."""
        sock = self.sockets.pop(label, None)
        if sock is not None:
            with contextlib.suppress(KeyError):
                self.poller.unregister(sock)
            sock.close(linger=0)

    def close(self) -> None:
        """Close every socket of this kernel connection: the connection monitors, shell, control,
        stdin, every IOPub SUB and the heartbeat REQ (LINGER 0). The context is the caller's."""
        for mon in self._monitors.values():
            mon.close(linger=0)
        self._monitors.clear()
        for label in list(self.sockets):
            self.close_socket(label)
        if self._hb is not None:
            self._hb.close(linger=0)
            self._hb = None

    # -- sending -------------------------------------------------------------
    def header(self, msg_type: str, **overrides: Any) -> dict[str, Any]:
        """A new message header from this client: fresh ``msg_id``, ``msg_type``, username
        "conformance", the client's ``session``, ``date`` now (UTC, ``Z``) and ``version``
        :data:`CLIENT_VERSION`; ``overrides`` replace or add fields (messaging spec "Message
        Header")."""
        h = {
            "msg_id": uuid.uuid4().hex,
            "msg_type": msg_type,
            "username": "conformance",
            "session": self.session,
            "date": now_iso(),
            "version": CLIENT_VERSION,
        }
        h.update(overrides)
        return h

    def frames(
        self,
        msg_type: str,
        content: Mapping[str, Any] | None = None,
        *,
        header: Mapping[str, Any] | None = None,
        parent: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, Any], list[bytes]]:
        """``(header, frames)`` of a correctly signed message (delimiter onwards)."""
        h = dict(header) if header is not None else self.header(msg_type)
        parts = [dumps(h), dumps(dict(parent or {})), dumps(dict(metadata or {})), dumps(dict(content or {}))]
        return h, [DELIM, self.signer.sign(parts), *parts]

    def send_frames(self, channel: str, frames: list[bytes], header: Mapping[str, Any] | None = None) -> None:
        """Send raw frames (after the routing prefix) on ``channel``; ``header``,
        if given, is remembered so a reply can be matched to it."""
        if header is not None and isinstance(header.get("msg_id"), str):
            self.sent[header["msg_id"]] = dict(header)
        self.sockets[channel].send_multipart(frames)

    def send(
        self,
        channel: str,
        msg_type: str,
        content: Mapping[str, Any] | None = None,
        **kw: Any,
    ) -> dict[str, Any]:
        """Sign and send one message; returns its header."""
        h, frames = self.frames(msg_type, content, **kw)
        self.send_frames(channel, frames, h)
        return h

    @staticmethod
    def execute_content(code: str, **content: Any) -> dict[str, Any]:
        """An execute_request's content: jupyter_client's defaults, ``content`` over them."""
        c = {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        }
        c.update(content)
        return c

    def execute(self, code: str, **content: Any) -> dict[str, Any]:
        """Send an execute_request (jupyter_client's defaults); returns its header."""
        return self.send("shell", "execute_request", self.execute_content(code, **content))

    # -- receiving -------------------------------------------------------------
    def pump(self, timeout: float) -> int:
        """Wait up to ``timeout`` s for any socket, then read all that is there."""
        n = 0
        events = dict(self.poller.poll(max(0, int(timeout * 1000))))
        for label, sock in list(self.sockets.items()):
            if sock in events:
                n += self.drain(label)
        return n

    def drain(self, label: str, limit: int | None = None) -> int:
        """Read what is queued on one socket (registered or not), up to ``limit``."""
        sock = self.sockets[label]
        n = 0
        while limit is None or n < limit:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._file(label, frames)
            n += 1
        return n

    def _file(self, label: str, frames: list[bytes]) -> None:
        channel = self.channel_of[label]
        msg = self._parse(label, channel, frames)
        if msg is None:
            return
        self.received[label] = self.received.get(label, 0) + 1
        request = self.sent.get(msg.parent_id) if channel in ("shell", "control", "stdin") else None
        self.audit.see(msg, request)
        sink = self.sinks.get(msg.parent_id)
        if sink is not None and sink(msg):
            return
        if msg.parent_id:
            self.by_parent.setdefault(msg.parent_id, []).append(msg)
        else:
            self.orphans.setdefault(label, []).append(msg)

    def _parse(self, label: str, channel: str, frames: list[bytes]) -> Received | None:
        try:
            i = frames.index(DELIM)
        except ValueError:
            self.audit.frames_error(label, "no <IDS|MSG> delimiter")
            return None
        if len(frames) < i + 6:
            self.audit.frames_error(label, f"{len(frames) - i - 1} frames after the delimiter, expected at least 5")
            return None
        sig, parts = frames[i + 1], frames[i + 2 : i + 6]
        ok = hmac.compare_digest(sig, self.signer.sign(parts))
        try:
            dicts = [json.loads(p) for p in parts]
        except (ValueError, UnicodeDecodeError) as exc:
            self.audit.frames_error(label, f"a JSON frame does not parse: {exc.__class__.__name__}")
            return None
        raw = None
        if not all(isinstance(d, dict) for d in dicts):
            # e.g. a null parent_header: the audit reports it; checks see {}
            raw = tuple(dicts)
            dicts = [d if isinstance(d, dict) else {} for d in dicts]
        self.seq += 1
        header, parent, metadata, content = dicts
        return Received(
            label,
            channel,
            self.seq,
            time.monotonic(),
            frames[:i],
            header,
            parent,
            metadata,
            content,
            frames[i + 6 :],
            ok,
            raw,
        )

    def wait(self, probe: Callable[[], T | None], timeout: float, what: str) -> T:
        """Pump until ``probe()`` returns non-None; raise Timeout(what) after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            got = probe()
            if got is not None:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"{what}: nothing within {timeout:g} s")
            self.pump(min(left, 0.05))

    def for_parent(self, msg_id: str, *, socket: str | None = None, channel: str | None = None) -> list[Received]:
        """Messages filed so far under parent ``msg_id`` (arrival order)."""
        out = self.by_parent.get(msg_id, [])
        if socket is not None:
            out = [m for m in out if m.socket == socket]
        if channel is not None:
            out = [m for m in out if m.channel == channel]
        return out

    def reply(self, request: Mapping[str, Any], timeout: float, channel: str | None = None) -> Received:
        """The reply to ``request`` (its header) on shell/control; Timeout if none."""
        mid = request["msg_id"]
        chans = (channel,) if channel else ("shell", "control")

        def probe() -> Received | None:
            for m in self.by_parent.get(mid, ()):
                if m.channel in chans:
                    return m
            return None

        return self.wait(probe, timeout, f"{request['msg_type']}: no reply")

    def until_idle(self, request: Mapping[str, Any], timeout: float, socket: str = "iopub") -> list[Received]:
        """IOPub messages of ``request`` up to and including its idle status."""
        mid = request["msg_id"]

        def probe() -> list[Received] | None:
            msgs = self.for_parent(mid, socket=socket)
            return msgs if any(is_idle(m) for m in msgs) else None

        return self.wait(probe, timeout, f"{request['msg_type']}: no idle status on {socket}")

    def exchange(self, request: Mapping[str, Any], timeout: float) -> tuple[Received, list[Received]]:
        """(reply, IOPub messages up to idle) of a request already sent."""
        reply = self.reply(request, timeout)
        return reply, self.until_idle(request, timeout)

    def request(
        self, channel: str, msg_type: str, content: Mapping[str, Any] | None, timeout: float
    ) -> tuple[Received, list[Received]]:
        """Send a signed ``msg_type`` with ``content`` on ``channel`` and return its reply and
        its IOPub messages up to idle (:meth:`exchange`). Raises :class:`Timeout` when either
        is not there within ``timeout`` seconds."""
        h = self.send(channel, msg_type, content)
        return self.exchange(h, timeout)

    def run(self, code: str, timeout: float, **content: Any) -> tuple[Received, list[Received]]:
        """Execute ``code``; (execute_reply, its IOPub messages up to idle)."""
        return self.exchange(self.execute(code, **content), timeout)

    # -- heartbeat -------------------------------------------------------------
    def ping(self, timeout: float, payload: bytes | None = None) -> float | None:
        """One heartbeat round trip: seconds, or None if no echo within ``timeout``
        (or an echo that differs). A timed-out REQ is replaced (it cannot resend)."""
        if self._hb is None:
            self._hb = self._open("hb", "hb")
        data = payload if payload is not None else os.urandom(8)
        t0 = time.monotonic()
        self._hb.send(data)
        if self._hb.poll(int(timeout * 1000)):
            echo = self._hb.recv()
            return time.monotonic() - t0 if echo == data else None
        self._hb.close(linger=0)
        self._hb = None
        return None


def stream_text(msgs: Iterable[Received], name: str = "stdout") -> str:
    """Concatenated text of the ``stream`` messages named ``name``."""
    return "".join(
        str(m.content.get("text", "")) for m in msgs if m.msg_type == "stream" and m.content.get("name") == name
    )
