"""JEP 66 kernel side: pure payloads (tier 1), register() against in-test launchers (tier 3),
and trikernel mode C as a subprocess against the same launchers (tier 3).

Launchers here are real pyzmq sockets on 127.0.0.1 run in a thread: a
dialect-J ROUTER (xeus / jupyter_client docs form) and a dialect-P REP
(ark / kallichore form), each with a behaviour: ack, bad signature, wrong
kernel_id, error status, unsigned raw JSON, or silent.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import zmq
from conftest import wait_ready

from trikernel.errors import ConfigError, HandshakeError, ProtocolError
from trikernel.protocol.handshake import (
    PORT_NAMES,
    Dialect,
    RegistrationInfo,
    bind_ip,
    build_ack_j,
    build_registration,
    build_registration_j,
    build_reply_p,
    build_request_p,
    detect_dialect,
    is_registration_file,
    parse_ack,
    parse_registration,
    parse_registration_frames,
)
from trikernel.protocol.wire import DELIM, Signer
from trikernel.server.registration import register

if TYPE_CHECKING:
    from collections.abc import Iterator

KEY = b"a0436f6c-1916-498b-8eb9-e81ab9368e84"
PORTS = {"shell_port": 50001, "iopub_port": 50002, "stdin_port": 50003, "control_port": 50004, "hb_port": 50005}
REPO = Path(__file__).resolve().parents[1]


def signer(key: bytes = KEY) -> Signer:
    return Signer(key, "hmac-sha256")


def reg_file_j(port: int | str, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "transport": "tcp",
        "ip": "127.0.0.1",
        "registration_ip": "127.0.0.1",
        "registration_port": port,
        "kernel_id": "kid-1",
        "key": KEY.decode(),
        "signature_scheme": "hmac-sha256",
    }
    d.update(extra)
    return d


def reg_file_p(port: int, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "transport": "tcp",
        "ip": "127.0.0.1",
        "registration_port": port,
        "key": KEY.decode(),
        "signature_scheme": "hmac-sha256",
    }
    d.update(extra)
    return d


# ---------------------------------------------------------------------------
# Tier 1: registration file
# ---------------------------------------------------------------------------


def test_is_registration_file() -> None:
    assert is_registration_file({"registration_port": 1})
    assert not is_registration_file({"shell_port": 1, "ip": "127.0.0.1"})


@pytest.mark.parametrize(
    ("d", "dialect"),
    [
        ({"registration_port": 1, "kernel_id": "x"}, Dialect.J),
        ({"registration_port": 1, "registration_ip": "127.0.0.1"}, Dialect.J),
        ({"registration_port": 1, "ip": "127.0.0.1"}, Dialect.P),
    ],
)
def test_detect_dialect(d: dict[str, Any], dialect: Dialect) -> None:
    assert detect_dialect(d) is dialect


def test_bind_ip_precedence() -> None:
    assert bind_ip({"ip": "10.0.0.1", "registration_ip": "10.0.0.2"}) == "10.0.0.1"
    assert bind_ip({"registration_ip": "10.0.0.2"}) == "10.0.0.2"
    assert bind_ip({"ip": "", "registration_ip": "10.0.0.2"}) == "10.0.0.2"
    assert bind_ip({}) == "127.0.0.1"
    with pytest.raises(ConfigError, match=r"^ip:"):
        bind_ip({"ip": 5})


@pytest.mark.parametrize("port", [5555, "5555", " 5555 "])
def test_parse_registration_port_int_or_str(port: int | str) -> None:
    info = parse_registration(reg_file_j(port))
    assert info.registration_port == 5555
    assert info.dialect is Dialect.J
    assert info.kernel_id == "kid-1"
    assert info.security.key == KEY
    assert info.registration_url == "tcp://127.0.0.1:5555"
    assert info.bind_ip == "127.0.0.1"


def test_parse_registration_dialect_p_uses_ip() -> None:
    info = parse_registration(reg_file_p(6000, ip="127.0.0.2"))
    assert info.dialect is Dialect.P
    assert info.kernel_id is None
    assert info.registration_ip == "127.0.0.2"
    assert info.bind_ip == "127.0.0.2"


def test_parse_registration_repr_hides_key() -> None:
    info = parse_registration(reg_file_j(5555))
    assert KEY.decode() not in repr(info)


@pytest.mark.parametrize(
    ("patch", "field_name"),
    [
        ({"registration_port": "abc"}, "registration_port"),
        ({"registration_port": 0}, "registration_port"),
        ({"registration_port": 70000}, "registration_port"),
        ({"registration_port": True}, "registration_port"),
        ({"transport": "ipc"}, "transport"),
        ({"signature_scheme": "hmac-nope"}, "signature_scheme"),
        ({"key": 12}, "key"),
        ({"kernel_id": 3}, "kernel_id"),
        ({"curve_publickey": "x" * 40}, "curve_secretkey"),
        ({"curve_publickey": "short", "curve_secretkey": "y" * 40}, "curve_publickey"),
    ],
)
def test_parse_registration_errors_name_the_field(patch: dict[str, Any], field_name: str) -> None:
    with pytest.raises(ConfigError, match=f"^{field_name}:"):
        parse_registration(reg_file_j(5555, **patch))


def test_parse_registration_requires_registration_port() -> None:
    with pytest.raises(ConfigError, match=r"^registration_port:"):
        parse_registration({"ip": "127.0.0.1", "key": ""})


def test_parse_registration_curve_keys() -> None:
    pub, sec = zmq.curve_keypair()
    info = parse_registration(reg_file_j(5555, curve_publickey=pub.decode(), curve_secretkey=sec.decode()))
    assert (info.security.curve_publickey, info.security.curve_secretkey) == (pub, sec)


# ---------------------------------------------------------------------------
# Tier 1: payloads, both dialects
# ---------------------------------------------------------------------------


def test_j_registration_shape_and_hmac_over_content_only() -> None:
    frames = build_registration_j("kid-1", PORTS, signer())
    assert frames[0] == DELIM
    assert len(frames) == 3
    content = json.loads(frames[2])
    assert content["kernel_id"] == "kid-1"
    assert {k: content[k] for k in PORT_NAMES} == {k: str(v) for k, v in PORTS.items()}
    assert frames[1] == hmac.new(KEY, frames[2], hashlib.sha256).hexdigest().encode()


def test_j_round_trip_through_router_prefix() -> None:
    frames = [b"\x00ident", *build_registration_j("kid-1", PORTS, signer())]
    prefix, reg = parse_registration_frames(frames, signer())
    assert prefix == [b"\x00ident"]
    assert reg.dialect is Dialect.J
    assert reg.kernel_id == "kid-1"
    assert reg.ports == PORTS


def test_p_round_trip_with_req_envelope() -> None:
    frames = [b"\x00ident", b"", *build_request_p(PORTS, signer())]
    prefix, reg = parse_registration_frames(frames, signer())
    assert prefix == [b"\x00ident", b""]
    assert reg.dialect is Dialect.P
    assert reg.ports == PORTS
    assert reg.kernel_id is None
    header = reg.request_header
    assert header["msg_type"] == "handshake_request"
    for key in ("msg_id", "session", "username", "date", "version"):
        assert header[key]
    content = json.loads(frames[-1])
    assert all(isinstance(content[k], int) for k in PORT_NAMES)


def test_launcher_rejects_bad_signature_both_dialects() -> None:
    for frames in (build_registration_j("k", PORTS, signer(b"other")), build_request_p(PORTS, signer(b"other"))):
        with pytest.raises(ProtocolError, match="signature"):
            parse_registration_frames([b"id", *frames], signer())


def test_launcher_rejects_bad_ports() -> None:
    bad = dict(PORTS, hb_port="nope")
    body = json.dumps({"kernel_id": "k", **bad}).encode()
    with pytest.raises(ProtocolError, match="hb_port"):
        parse_registration_frames([b"id", DELIM, signer().sign([body]), body], signer())
    missing = {k: v for k, v in PORTS.items() if k != "stdin_port"}
    with pytest.raises(ProtocolError, match="stdin_port"):
        build_registration_j("k", missing, signer())


def test_ack_j_forms() -> None:
    s = signer()
    assert parse_ack(build_ack_j(s), signer(), Dialect.J) == {"status": "ok"}
    xeus_ack = [DELIM, s.sign([b"ACK"]), b"ACK"]  # what xeus's launcher sends
    assert parse_ack(xeus_ack, signer(), Dialect.J) == {}
    with pytest.raises(HandshakeError, match=r"refused.*wrong id"):
        parse_ack(build_ack_j(s, error="wrong id"), signer(), Dialect.J)
    with pytest.raises(HandshakeError, match="signature"):
        parse_ack(build_ack_j(signer(b"evil")), signer(), Dialect.J)
    with pytest.raises(HandshakeError, match="unsigned"):
        parse_ack([DELIM, b"", b"ACK"], signer(), Dialect.J)


def test_ack_p_forms() -> None:
    header = {"msg_id": "1", "msg_type": "handshake_request", "session": "s"}
    assert parse_ack([b"", *build_reply_p(signer(), header)], signer(), Dialect.P)["status"] == "ok"
    with pytest.raises(HandshakeError, match="busy"):
        parse_ack(build_reply_p(signer(), header, error="busy"), signer(), Dialect.P)
    with pytest.raises(HandshakeError, match="unparseable"):
        parse_ack([b'{"status": "error", "error": "parse failure"}'], signer(), Dialect.P)
    with pytest.raises(HandshakeError, match="signature"):
        parse_ack(build_reply_p(signer(b"evil"), header), signer(), Dialect.P)


def test_unsigned_connection_accepts_unsigned_ack() -> None:
    s = Signer(b"", "hmac-sha256")
    assert parse_ack(build_ack_j(s), s, Dialect.J) == {"status": "ok"}


def test_build_registration_p_is_req_compatible() -> None:
    info = parse_registration(reg_file_p(5555))
    frames = build_registration(info, PORTS, signer())
    assert frames[0] == b""
    assert frames[1] == DELIM


# ---------------------------------------------------------------------------
# In-test launchers (real sockets, loopback only)
# ---------------------------------------------------------------------------

BEHAVIOURS = ("ack", "xeus_ack", "bad_sig", "wrong_id", "error", "raw_json", "silent")


@dataclass
class Launcher:
    """A registration socket served from a thread: dialect J = ROUTER, P = REP."""

    dialect: Dialect
    behaviour: str
    kernel_id: str = "kid-1"
    port: int = 0
    received: queue.Queue[Any] = field(default_factory=queue.Queue)
    _stop: threading.Event = field(default_factory=threading.Event)
    _ready: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Launcher:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(5)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(5)

    def _run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER if self.dialect is Dialect.J else zmq.REP)
        sock.linger = 0
        self.port = sock.bind_to_random_port("tcp://127.0.0.1")
        self._ready.set()
        try:
            while not self._stop.is_set():
                if not sock.poll(50):
                    continue
                frames = sock.recv_multipart()
                self._answer(sock, frames)
        finally:
            sock.close(linger=500)
            ctx.term()

    def _answer(self, sock: zmq.Socket, frames: list[bytes]) -> None:
        good = signer()
        try:
            prefix, reg = parse_registration_frames(frames, good)
        except ProtocolError as exc:
            self.received.put(exc)
            return
        self.received.put(reg)
        reply_signer = signer(b"not-the-key") if self.behaviour == "bad_sig" else good
        error: str | None = None
        if self.behaviour == "error":
            error = "launcher is shutting down"
        if self.behaviour == "wrong_id" or (self.dialect is Dialect.J and reg.kernel_id != self.kernel_id):
            error = f"kernel_id {reg.kernel_id!r} is not the expected one"
        if self.behaviour == "silent":
            return
        if self.behaviour == "raw_json":
            body = [b'{"status": "error", "error": "could not parse handshake"}']
        elif self.behaviour == "xeus_ack":
            body = [DELIM, reply_signer.sign([b"ACK"]), b"ACK"]
        elif self.dialect is Dialect.J:
            body = build_ack_j(reply_signer, error=error)
        else:
            body = build_reply_p(reply_signer, reg.request_header, error=error)
        sock.send_multipart([*prefix, *body])


@pytest.fixture
def launcher_factory() -> Iterator[Any]:
    started: list[Launcher] = []

    def make(dialect: Dialect, behaviour: str, kernel_id: str = "kid-1") -> Launcher:
        launcher = Launcher(dialect, behaviour, kernel_id).start()
        started.append(launcher)
        return launcher

    yield make
    for launcher in started:
        launcher.stop()


def reg_for(launcher: Launcher, kernel_id: str = "kid-1") -> RegistrationInfo:
    if launcher.dialect is Dialect.J:
        # xeus writes the port as a string: the kernel must accept that
        return parse_registration(reg_file_j(str(launcher.port), kernel_id=kernel_id))
    return parse_registration(reg_file_p(launcher.port))


# ---------------------------------------------------------------------------
# Tier 3: register() against the launchers
# ---------------------------------------------------------------------------


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("dialect", "behaviour"), [(Dialect.J, "ack"), (Dialect.J, "xeus_ack"), (Dialect.P, "ack")])
def test_register_succeeds(launcher_factory: Any, dialect: Dialect, behaviour: str) -> None:
    launcher = launcher_factory(dialect, behaviour)
    register(reg_for(launcher), dict(PORTS), signer(), timeout=5)
    reg = launcher.received.get(timeout=1)
    assert reg.dialect is dialect
    assert reg.ports == PORTS
    if dialect is Dialect.J:
        assert reg.kernel_id == "kid-1"


FAILURES = [
    (Dialect.J, "bad_sig", "signature"),
    (Dialect.P, "bad_sig", "signature"),
    (Dialect.J, "wrong_id", "refused"),
    (Dialect.P, "wrong_id", "refused"),
    (Dialect.J, "error", "refused"),
    (Dialect.P, "error", "refused"),
    (Dialect.P, "raw_json", "unparseable"),
    (Dialect.J, "silent", "no acknowledgement"),
    (Dialect.P, "silent", "no acknowledgement"),
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("dialect", "behaviour", "match"), FAILURES)
def test_register_fails_within_timeout(launcher_factory: Any, dialect: Dialect, behaviour: str, match: str) -> None:
    launcher = launcher_factory(dialect, behaviour)
    with pytest.raises(HandshakeError, match=match):  # raised at all: the pytest timeout bounds a hang
        register(reg_for(launcher), dict(PORTS), signer(), timeout=1.0)


@pytest.mark.timeout(20)
def test_register_with_nobody_listening_times_out() -> None:
    with zmq.Context() as ctx, ctx.socket(zmq.ROUTER) as s:
        port = s.bind_to_random_port("tcp://127.0.0.1")
    t0 = time.monotonic()
    with pytest.raises(HandshakeError, match="no acknowledgement"):
        register(parse_registration(reg_file_j(port)), dict(PORTS), signer(), timeout=0.5)
    assert time.monotonic() - t0 >= 0.5  # the timeout's own path (a lower bound holds under load)


def test_register_rejects_bad_timeout_and_ports() -> None:
    info = parse_registration(reg_file_j(5555))
    with pytest.raises(HandshakeError, match="timeout"):
        register(info, dict(PORTS), signer(), timeout=0)
    with pytest.raises(HandshakeError, match="shell_port"):
        register(info, {"iopub_port": 1}, signer(), timeout=1)


# ---------------------------------------------------------------------------
# Tier 3: trikernel mode C as a subprocess (needs cli.py: `python -m trikernel -f FILE
# --handshake-timeout S`); these wait on the kernel integration.
# ---------------------------------------------------------------------------


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _start_trikernel(path: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "trikernel", "-f", str(path), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_kernel_env(),
    )


def _stop(proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    if proc.poll() is None:
        proc.kill()
    return proc.communicate(timeout=10)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dialect", [Dialect.J, Dialect.P])
def test_trikernel_registers_and_serves(launcher_factory: Any, tmp_path: Path, dialect: Dialect) -> None:
    from jupyter_client import BlockingKernelClient

    launcher = launcher_factory(dialect, "ack")
    d = reg_file_j(launcher.port) if dialect is Dialect.J else reg_file_p(launcher.port)
    path = tmp_path / "registration.json"
    path.write_text(json.dumps(d))
    written = tmp_path / "connection.json"
    proc = _start_trikernel(path, "--handshake-timeout", "10", "--write-connection-file", str(written))
    try:
        reg = launcher.received.get(timeout=30)
        assert not isinstance(reg, Exception), reg
        assert reg.dialect is dialect
        kc = BlockingKernelClient()
        kc.load_connection_info(
            {"ip": "127.0.0.1", "transport": "tcp", "key": KEY.decode(), "signature_scheme": "hmac-sha256", **reg.ports}
        )
        kc.start_channels()
        try:
            wait_ready(proc, kc)
            reply = kc.execute_interactive("1+1", timeout=30)
            assert reply["content"]["status"] == "ok"
        finally:
            kc.stop_channels()
        info = json.loads(written.read_text())
        assert {k: int(info[k]) for k in PORT_NAMES} == reg.ports
        assert "registration_port" not in info
    finally:
        _stop(proc)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("dialect", "behaviour", "match"), FAILURES)
def test_trikernel_exits_nonzero_when_handshake_fails(
    launcher_factory: Any, tmp_path: Path, dialect: Dialect, behaviour: str, match: str
) -> None:
    launcher = launcher_factory(dialect, behaviour)
    d = reg_file_j(launcher.port) if dialect is Dialect.J else reg_file_p(launcher.port)
    path = tmp_path / "registration.json"
    path.write_text(json.dumps(d))
    timeout = 2.0
    proc = _start_trikernel(path, "--handshake-timeout", str(timeout))
    try:
        code = proc.wait(timeout=timeout + 25)  # interpreter start-up + timeout
    finally:
        _, err = _stop(proc)
    assert code != 0
    assert match in err.decode("utf-8", "replace"), err.decode("utf-8", "replace")
