"""Gateway launch mode, without a gateway: pure parts (tier 1), the comm port
served in process on loopback (tier 2), kernelspecs and the container recipe.

The payload is decrypted with gateway_provisioners' own
``ResponseManager._decode_payload`` (the code GP's server runs), on an
object holding exactly the state that method reads. Real GP servers and
real kernels are in test_gateway_gp.py.
"""

from __future__ import annotations

import os

# gateway_provisioners reads these when its modules are imported.
os.environ.setdefault("GP_RESPONSE_IP", "127.0.0.1")

import base64
import contextlib
import json
import logging
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from trikernel.errors import BindError, ConfigError, ProtocolError
from trikernel.launch import gateway, gatewayspec
from trikernel.protocol import gateway as gwproto
from trikernel.protocol.connection import ConnectionInfo
from trikernel.server import commport
from trikernel.server.sockets import bind_in_range

REPO = Path(__file__).resolve().parents[1]
BOOTSTRAP = REPO / "containers" / "bootstrap-kernel.sh"
DOCKERFILE = REPO / "containers" / "Dockerfile"

RSA = pytest.importorskip("Cryptodome.PublicKey.RSA", reason="GP's crypto (pycryptodomex) is needed")
ResponseManager = pytest.importorskip("gateway_provisioners.response_manager").ResponseManager


class GPServerKeys:
    """The state GP's ``ResponseManager._decode_payload`` reads (and ``public_key``),
    with a 1024-bit RSA key made the way ResponseManager makes its own."""

    def __init__(self) -> None:
        self._private_key = RSA.generate(ResponseManager.KEY_SIZE)
        self._public_pem = self._private_key.publickey().export_key("PEM")
        self._response_registry: dict[str, Any] = {}
        self.log = logging.getLogger("test.gp")

    @property
    def public_key(self) -> str:
        return ResponseManager.public_key.fget(self)  # type: ignore[attr-defined,no-any-return]

    def decode(self, data: bytes) -> dict[str, Any]:
        return ResponseManager._decode_payload(self, data)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def gp() -> GPServerKeys:
    return GPServerKeys()


def sample_conn(curve: bool = False) -> ConnectionInfo:
    import zmq

    pub, sec = zmq.curve_keypair() if curve else (None, None)
    return ConnectionInfo(
        ip="0.0.0.0",
        shell_port=40001,
        iopub_port=40002,
        stdin_port=40003,
        control_port=40004,
        hb_port=40005,
        key=b"a0b1c2d3e4f5",
        kernel_name="",
        curve_publickey=pub,
        curve_secretkey=sec,
    )


# ---------------------------------------------------------------------------
# Payload (tier 1), decrypted by GP's ResponseManager code
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("curve", [False, True], ids=["plain", "curve"])
def test_payload_round_trips_every_field_through_gp_decode(gp: GPServerKeys, curve: bool) -> None:
    conn = sample_conn(curve)
    info = gwproto.connection_info(conn, kernel_id="k-1", comm_port=40006, pid=1234, pgid=1230)
    got = gp.decode(gwproto.build_payload(info, gp.public_key))
    want = {**info, "key": info["key"].encode()}  # GP hands the key on as bytes
    assert got == want
    expected = {
        "shell_port", "iopub_port", "stdin_port", "control_port", "hb_port", "ip", "key", "transport",
        "signature_scheme", "kernel_name", "pid", "pgid", "comm_port", "kernel_id",
    }  # fmt: skip
    assert set(got) == expected | ({"curve_publickey", "curve_secretkey"} if curve else set())
    if curve:
        assert got["curve_publickey"] == conn.curve_publickey.decode()  # type: ignore[union-attr]


def test_payload_shape_is_gp_v1(gp: GPServerKeys) -> None:
    payload = json.loads(base64.b64decode(gwproto.build_payload({"kernel_id": "x"}, gp.public_key)))
    assert set(payload) == {"version", "key", "conn_info"}
    assert payload["version"] == 1
    assert len(base64.b64decode(payload["key"])) == 128  # one RSA-1024 block: the wrapped 16-byte AES key
    assert len(base64.b64decode(payload["conn_info"])) % 16 == 0  # AES blocks, PKCS#7-padded


def test_payload_accepts_a_pem_key_and_a_loaded_key(gp: GPServerKeys) -> None:
    pem = gp._public_pem.decode()
    info = {"kernel_id": "pem"}
    assert gp.decode(gwproto.build_payload(info, pem))["kernel_id"] == "pem"
    key = gwproto.load_public_key(gp.public_key)
    assert gp.decode(gwproto.build_payload(info, key))["kernel_id"] == "pem"


def test_payload_for_another_server_key_is_refused_by_gp(gp: GPServerKeys) -> None:
    other = GPServerKeys()
    gp._response_registry = {"k-2": object()}  # GP's legacy v0 fallback tries registered ids; must not match
    try:
        # the RSA unwrap fails (GP's sentinel is 1 byte; or the ciphertext is
        # larger than this key's modulus, when the other key's is larger) or,
        # very rarely, the AES padding does
        with pytest.raises(ValueError, match=r"AES key length|[Pp]adding|Ciphertext too large"):
            gp.decode(gwproto.build_payload({"kernel_id": "k-2"}, other.public_key))
    finally:
        gp._response_registry = {}


@pytest.mark.parametrize("version", [0, 2, "1"])
def test_payload_with_another_version_is_refused_by_gp(gp: GPServerKeys, version: Any) -> None:
    with pytest.raises(ValueError, match="version"):
        gp.decode(gwproto.build_payload({"kernel_id": "k-3"}, gp.public_key, version=version))


def test_each_payload_has_a_fresh_aes_key(gp: GPServerKeys) -> None:
    a = json.loads(base64.b64decode(gwproto.build_payload({"kernel_id": "same"}, gp.public_key)))
    b = json.loads(base64.b64decode(gwproto.build_payload({"kernel_id": "same"}, gp.public_key)))
    assert a["conn_info"] != b["conn_info"]


@pytest.mark.parametrize(
    ("value", "why"),
    [("", "base64"), ("not base64!", "base64"), (base64.b64encode(b"garbage").decode(), "base64")],
)
def test_bad_public_key_is_one_config_error(value: str, why: str) -> None:
    with pytest.raises(ConfigError, match=rf"^--public-key: .*{why}"):
        gwproto.load_public_key(value)


def test_non_rsa_public_key_is_refused() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    der = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(ConfigError, match=r"^--public-key: not an RSA public key"):
        gwproto.load_public_key(base64.b64encode(der).decode())


# ---------------------------------------------------------------------------
# Flags (tier 1)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (None, None), ("", None), ("0..0", None), ("40000..40000", None), ("{port_range}", None),
        ("40000..41000", (40000, 41000)), (" 1024..65535 ", (1024, 65535)), ("1..2", (1, 2)),
    ],
)  # fmt: skip
def test_parse_port_range(value: str | None, want: tuple[int, int] | None) -> None:
    assert gwproto.parse_port_range(value) == want


@pytest.mark.parametrize("value", ["40000", "a..b", "1..2..3", "-1..5", "41000..40000", "0..70000", "0..5"])
def test_bad_port_range_names_the_flag(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^--port-range: "):
        gwproto.parse_port_range(value)


@given(st.integers(1, 65535), st.integers(1, 65535))
def test_port_range_property(a: int, b: int) -> None:
    lower, upper = min(a, b), max(a, b)
    got = gwproto.parse_port_range(f"{lower}..{upper}")
    assert got == (None if lower == upper else (lower, upper))


@pytest.mark.parametrize(
    ("value", "want"),
    [("127.0.0.1:8877", ("127.0.0.1", 8877)), ("gw.example:1", ("gw.example", 1)), ("[::1]:9", ("::1", 9))],
)
def test_parse_response_address(value: str, want: tuple[str, int]) -> None:
    assert gwproto.parse_response_address(value) == want


@pytest.mark.parametrize("value", [None, "", "127.0.0.1", ":8877", "h:0", "h:70000", "h:x", "{response_address}"])
def test_bad_response_address_names_the_flag(value: str | None) -> None:
    with pytest.raises(ConfigError, match=r"^--response-address: "):
        gwproto.parse_response_address(value)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (None, None), ("", None), ("disabled", None), ("{transport_encryption}", None),
        ("auto", "auto"), ("REQUIRED", "required"), (" required ", "required"),
    ],
)  # fmt: skip
def test_parse_transport_encryption(value: str | None, want: str | None) -> None:
    assert gwproto.parse_transport_encryption(value) == want


def test_unknown_transport_encryption_policy_stops_start_up() -> None:
    with pytest.raises(ConfigError, match=r"^--transport-encryption: expected auto, required or disabled"):
        gwproto.parse_transport_encryption("requried")


GP_ARGV = [  # GP 0.5.0 kernel-specs/ssh_python argv, as DistributedProvisioner substitutes it
    "--kernel-id", "0d6f", "--port-range", "0..0", "--response-address", "10.0.0.1:8877",
    "--public-key", "PK", "--transport-encryption", "", "--kernel-class-name", "ipykernel.ipkernel.IPythonKernel",
]  # fmt: skip
EG_ARGV = [  # EG 3.3.0 etc/kernelspecs/python_distributed argv, substituted (no transport encryption)
    "--RemoteProcessProxy.kernel-id", "0d6f", "--RemoteProcessProxy.response-address", "10.0.0.1:8877",
    "--RemoteProcessProxy.public-key", "PK", "--RemoteProcessProxy.port-range", "40000..41000",
    "--RemoteProcessProxy.spark-context-initialization-mode", "none",
]  # fmt: skip
BOOTSTRAP_ARGV = [  # GP/EG bootstrap-kernel.sh's launch_python_kernel, with its optional flags
    "--kernel-id", "0d6f", "--port-range", "0..0", "--response-address", "10.0.0.1:8877", "--public-key", "PK",
    "--spark-context-initialization-mode", "none", "--kernel-class-name", "x.Y", "--transport-encryption", "auto",
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "port_range", "policy", "ignored"),
    [
        (GP_ARGV, None, None, ["--kernel-class-name=ipykernel.ipkernel.IPythonKernel"]),
        (EG_ARGV, (40000, 41000), None, ["--spark-context-initialization-mode=none"]),
        (BOOTSTRAP_ARGV, None, "auto", ["--spark-context-initialization-mode=none", "--kernel-class-name=x.Y"]),
        ([*GP_ARGV[:8], "--transport-encryption", "{transport_encryption}", "--cluster-type", "spark"], None, None,
         ["--cluster-type=spark"]),
    ],
    ids=["gp-local", "eg-remote-process-proxy", "bootstrap", "unsubstituted-policy"],
)  # fmt: skip
def test_launcher_accepts_the_flags_gp_and_eg_pass(
    argv: list[str], port_range: Any, policy: Any, ignored: list[str]
) -> None:
    ns = gateway.launch_parser().parse_args(argv)
    args = gateway.launch_args(ns)
    assert args == gateway.LaunchArgs("0d6f", ("10.0.0.1", 8877), "PK", port_range, policy, "0.0.0.0")
    assert gateway.ignored_flags(ns) == ignored


def test_launcher_parses_gp_ssh_command_line_where_an_empty_value_vanished() -> None:
    """Over SSH, GP joins argv into a shell command without quoting: the empty
    ``{transport_encryption}`` leaves ``--transport-encryption`` with no value."""
    import shlex

    command = " ".join(GP_ARGV)  # distributed.py _build_startup_command: startup_cmd += f" {arg}"
    ns = gateway.launch_parser().parse_args(shlex.split(command))
    args = gateway.launch_args(ns)
    assert args.transport_encryption is None
    assert args.kernel_id == "0d6f"
    assert gateway.ignored_flags(ns) == ["--kernel-class-name=ipykernel.ipkernel.IPythonKernel"]


def test_launcher_also_takes_the_kernel_options() -> None:
    ns = gateway.launch_parser().parse_args(
        [*GP_ARGV, "--ip", "127.0.0.1", "--socket-option", "iopub.SNDHWM=5", "--shutdown-grace", "1"]
    )
    assert gateway.launch_args(ns).ip == "127.0.0.1"
    assert ns.socket_options == ["iopub.SNDHWM=5"]
    assert ns.shutdown_grace == 1.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--response-address", "h:1", "--public-key", "PK"], "^--kernel-id: missing"),
        (["--kernel-id", "{kernel_id}", "--response-address", "h:1", "--public-key", "PK"],
         "^--kernel-id: .*placeholder"),
        (["--kernel-id", "k", "--response-address", "h:1"], "^--public-key: missing"),
        (["--kernel-id", "k", "--public-key", "PK"], "^--response-address: missing"),
    ],
)  # fmt: skip
def test_missing_launcher_flag_is_named(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        gateway.launch_args(gateway.launch_parser().parse_args(argv))


def test_unknown_flag_is_one_config_error_not_a_usage_dump() -> None:
    with pytest.raises(ConfigError, match="unrecognized arguments: --bogus"):
        gateway.launch_parser().parse_args([*GP_ARGV, "--bogus"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kernel-id", "k"], "--public-key: missing"),
        ([*GP_ARGV[:6], "--public-key", "not base64!"], "--public-key: not a base64-encoded RSA public key"),
        ([*GP_ARGV, "--port-range", "9..1"], "--port-range: lower port 9 is above upper port 1"),
        ([*GP_ARGV, "--nope"], "unrecognized arguments: --nope"),
    ],
)
def test_gateway_launch_bad_flag_exits_2_with_one_line(argv: list[str], message: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "trikernel", "gateway-launch", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"trikernel: {message}"), r.stderr


# ---------------------------------------------------------------------------
# Comm-port protocol (tier 1)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "want"),
    [
        (b'{"signum": 0}', gwproto.CommRequest(0, False)),
        (b'{"signum": 2}', gwproto.CommRequest(2, False)),
        (b'{"signum": "15"}', gwproto.CommRequest(15, False)),
        (b'{"shutdown": 1}', gwproto.CommRequest(None, True)),
        (b'{"shutdown": 0}', gwproto.CommRequest(None, False)),
        (b'{"signum": 9, "shutdown": true, "extra": [1]}', gwproto.CommRequest(9, True)),
    ],
)
def test_parse_comm_request(data: bytes, want: gwproto.CommRequest) -> None:
    assert gwproto.parse_comm_request(data) == want


@pytest.mark.parametrize(
    "data",
    [b"", b"\xff\xfe", b"signum", b"[1]", b"{}", b'{"other": 1}', b'{"signum": -1}', b'{"signum": 200}',
     b'{"signum": true}', b'{"signum": 2.5}', b'{"signum": "two"}', b'{"signum": 2}{"signum": 3}'],
)  # fmt: skip
def test_bad_comm_request_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        gwproto.parse_comm_request(data)


@given(st.binary(max_size=64))
def test_parse_comm_request_never_raises_anything_else(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        gwproto.parse_comm_request(data)


# ---------------------------------------------------------------------------
# Binding within a port range (real sockets)
# ---------------------------------------------------------------------------


def _tcp() -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return s


def _free_block(size: int) -> tuple[int, list[socket.socket]]:
    """A run of ``size`` consecutive ports, all held (listening) by this test."""
    for _ in range(50):
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        base = probe.getsockname()[1]
        probe.close()
        if base + size > 65535:
            continue
        held: list[socket.socket] = []
        try:
            for p in range(base, base + size):
                s = _tcp()
                held.append(s)
                s.bind(("127.0.0.1", p))
                s.listen()
            return base, held
        except OSError:
            for s in held:
                s.close()
    pytest.skip("no run of free ports found")


def test_bind_in_range_finds_the_one_free_port_and_keeps_it() -> None:
    base, held = _free_block(8)
    try:
        free = base + 5
        held[5].close()
        sock = socket.socket()  # no SO_REUSEADDR: the bind alone holds the port (as bind_comm_listener does)
        other = socket.socket()
        try:
            got = bind_in_range(sock, "comm port", lambda p: ("127.0.0.1", p), (base, base + 7))
            assert got == free
            assert sock.getsockname()[1] == free  # still held: nobody else can take it
            with pytest.raises(BindError, match=rf"^cannot bind comm port: no free port in the port range {base}\.\."):
                bind_in_range(other, "comm port", lambda p: ("127.0.0.1", p), (base, base + 7))
        finally:
            sock.close()
            other.close()
    finally:
        for s in held:
            s.close()


def test_create_and_bind_within_a_range_holds_five_ports_inside_it() -> None:
    from trikernel.server.sockets import create_and_bind

    base, held = _free_block(12)
    for s in held:
        s.close()
    bound = create_and_bind(ConnectionInfo(ip="127.0.0.1"), lambda sock, ch: None, port_range=(base, base + 11))
    try:
        ports = list(bound.ports.values())
        assert len(set(ports)) == 5
        assert all(base <= p <= base + 11 for p in ports)
        for p in ports:  # really held
            with pytest.raises(OSError, match="in use"), socket.create_server(("127.0.0.1", p)):
                pass
    finally:
        bound.destroy()


def test_bind_comm_listener_listens_in_range() -> None:
    base, held = _free_block(4)
    for s in held:
        s.close()
    sock = commport.bind_comm_listener("127.0.0.1", (base, base + 3))
    try:
        port = sock.getsockname()[1]
        assert base <= port <= base + 3
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # accepted by the backlog
    finally:
        sock.close()


# ---------------------------------------------------------------------------
# The comm-port server (tier 2: trio in process, real TCP on loopback)
# ---------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, int | None]] = []
        self.changed = trio.Event()

    def on_signal(self, signum: int) -> None:
        if signum == 99:
            raise RuntimeError("handler failed")
        self._add(("signal", signum))

    def on_shutdown(self) -> None:
        self._add(("shutdown", None))

    def _add(self, event: tuple[str, int | None]) -> None:
        self.events.append(event)
        self.changed.set()
        self.changed = trio.Event()


async def _send(port: int, data: bytes, *, close: bool = True) -> trio.SocketStream:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    if data:
        await stream.send_all(data)
    if close:
        await stream.send_eof()
        await stream.aclose()
    return stream


async def _comm_server(nursery: trio.Nursery, rec: Recorder, stats: commport.CommPortStats) -> int:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await nursery.start(
        lambda task_status: commport.serve_comm_port(
            listeners[0], on_signal=rec.on_signal, on_shutdown=rec.on_shutdown, stats=stats, task_status=task_status
        )
    )
    return port


async def _until(rec: Recorder, n: int) -> None:
    while len(rec.events) < n:
        await rec.changed.wait()


def test_comm_port_dispatches_gp_requests_and_drops_bad_ones(caplog: pytest.LogCaptureFixture) -> None:
    rec, stats = Recorder(), commport.CommPortStats()

    async def main() -> None:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                port = await _comm_server(nursery, rec, stats)
                await _send(port, b'{"signum": 0}')  # liveness poll: no callback
                await _send(port, b"not json")  # dropped
                await _send(port, b"")  # a TCP health check
                await _send(port, b'{"signum": 99}')  # the callback raises: logged, port keeps serving
                await _send(port, b'{"signum": 2}')
                await _until(rec, 1)
                await _send(port, b'{"shutdown": 1}')
                await _until(rec, 2)
                await _send(port, b'{"signum": 15, "shutdown": 1}')
                await _until(rec, 4)
                nursery.cancel_scope.cancel()

    with caplog.at_level(logging.INFO, logger="trikernel.commport"):
        trio.run(main)
    assert rec.events == [("signal", 2), ("shutdown", None), ("signal", 15), ("shutdown", None)]
    assert stats.as_dict() == {"polls": 1, "signals": 3, "shutdowns": 2, "empty": 1, "dropped": 1}
    text = caplog.text
    assert "dropped a bad request: not a JSON object" in text
    assert "handling a request failed" in text


def test_comm_port_drops_oversized_and_slow_requests_and_keeps_serving(caplog: pytest.LogCaptureFixture) -> None:
    rec, stats = Recorder(), commport.CommPortStats()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            port = await _comm_server(nursery, rec, stats)
            with contextlib.suppress(trio.BrokenResourceError):  # the port hangs up on it
                await _send(port, b" " * (commport.COMM_MAX_BYTES + 10) + b'{"signum": 2}')
            slow = await _send(port, b'{"signum": ', close=False)  # never finishes: autojump clock times it out
            await trio.sleep(commport.COMM_READ_TIMEOUT + 1)
            await slow.aclose()
            await _send(port, b'{"signum": 2}')
            await _until(rec, 1)
            nursery.cancel_scope.cancel()

    with caplog.at_level(logging.WARNING, logger="trikernel.commport"):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert rec.events == [("signal", 2)]
    assert stats.dropped == 2
    assert f"larger than {commport.COMM_MAX_BYTES} bytes" in caplog.text
    assert "not completed within" in caplog.text


def test_comm_port_service_serves_a_duplicate_and_the_owner_closes_the_port() -> None:
    sock = commport.bind_comm_listener("127.0.0.1", None)
    port = sock.getsockname()[1]
    rec = Recorder()
    service = commport.service(sock, on_signal=rec.on_signal, on_shutdown=rec.on_shutdown)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(service)
            await _send(port, b'{"signum": 2}')
            await _until(rec, 1)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert rec.events == [("signal", 2)]
    # the service is over; the launcher's socket still listens (liveness "alive") until it closes it
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    sock.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


# ---------------------------------------------------------------------------
# Kernelspecs (tier 1 shapes; install through the CLI)
# ---------------------------------------------------------------------------

PLACEHOLDERS = ["{kernel_id}", "{port_range}", "{response_address}", "{public_key}", "{transport_encryption}"]


def _flag_values(argv: list[str]) -> dict[str, str]:
    return {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}


def test_distributed_kernelspec_is_what_gp_expects() -> None:
    spec = gatewayspec.GatewaySpec(
        "distributed", remote_hosts=("h1", "h2"), port_range="40000..41000", launch_timeout=60, python="/opt/py",
        ip="10.0.0.5", socket_options=("iopub.SNDHWM=20000",),
    )  # fmt: skip
    kj = gatewayspec.kernel_json(spec)
    argv = kj["argv"]
    assert argv[:4] == ["/opt/py", "-m", "trikernel", "gateway-launch"]
    flags = _flag_values(argv)
    assert [flags[f] for f in ("--kernel-id", "--port-range", "--response-address", "--public-key")] == PLACEHOLDERS[:4]
    assert flags["--transport-encryption"] == "{transport_encryption}"  # GP's condition for CurveZMQ
    assert flags["--ip"] == "10.0.0.5"
    assert "--socket-option" not in argv  # over SSH GP joins argv unquoted; the env is exported quoted
    assert kj["env"] == {"TRIKERNEL_SOCKET_OPTIONS": "iopub.SNDHWM=20000"}
    assert kj["interrupt_mode"] == "signal"
    assert kj["metadata"]["supported_encryption"] == ["curve"]
    assert kj["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "distributed-provisioner",
        "config": {"remote_hosts": ["h1", "h2"], "port_range": "40000..41000", "launch_timeout": 60},
    }
    assert "process_proxy" not in kj["metadata"]


def test_distributed_kernelspec_is_accepted_by_gp_provisioner_and_parsed_by_our_launcher() -> None:
    """GP's own pre_launch placeholder substitution on our argv gives flags gateway-launch accepts."""
    from jupyter_client.kernelspec import KernelSpec

    pytest.importorskip("gateway_provisioners.distributed")
    from gateway_provisioners.remote_provisioner import RemoteProvisionerBase

    kj = gatewayspec.kernel_json(gatewayspec.GatewaySpec("distributed", remote_hosts=("localhost",)))
    ks = KernelSpec(**{k: v for k, v in kj.items() if k != "kernel_protocol_version"})
    assert RemoteProvisionerBase._kernel_spec_supports_curve(type("P", (), {"kernel_spec": ks})())  # type: ignore[arg-type]
    assert RemoteProvisionerBase._kernel_spec_passes_policy(type("P", (), {"kernel_spec": ks})())  # type: ignore[arg-type]
    ns = {"kernel_id": "kid", "response_address": "127.0.0.1:8877", "public_key": "PK", "port_range": "0..0",
          "transport_encryption": "required"}  # fmt: skip
    cmd = [re.sub(r"{([A-Za-z0-9_]+)}", lambda m: ns.get(m.group(1), m.group()), a) for a in ks.argv]
    args = gateway.launch_args(gateway.launch_parser().parse_args(cmd[4:]))
    assert (args.kernel_id, args.response_address, args.transport_encryption) == (
        "kid",
        ("127.0.0.1", 8877),
        "required",
    )


def test_eg_process_proxy_form() -> None:
    kj = gatewayspec.kernel_json(gatewayspec.GatewaySpec("distributed", process_proxy=True, remote_hosts=("a", "b")))
    assert "kernel_provisioner" not in kj["metadata"]
    assert kj["metadata"]["process_proxy"] == {
        "class_name": "enterprise_gateway.services.processproxies.distributed.DistributedProcessProxy",
        "config": {"remote_hosts": "a,b"},  # EG splits a string on commas
    }
    assert kj["argv"][3] == "gateway-launch"


@pytest.mark.parametrize(
    ("gw", "provisioner", "script"),
    [("kubernetes", "kubernetes-provisioner", "launch_kubernetes.py"),
     ("docker", "docker-provisioner", "launch_docker.py"),
     ("docker-swarm", "docker-swarm-provisioner", "launch_docker.py")],
)  # fmt: skip
def test_container_kernelspecs_run_gp_launchers_with_our_image(gw: str, provisioner: str, script: str) -> None:
    spec = gatewayspec.GatewaySpec(gw, image_name="trikernel/kernel-py:0.1.0", socket_options=("*.LINGER=0",))
    kj = gatewayspec.kernel_json(spec, launcher_script=f"/k/scripts/{script}")
    assert kj["argv"][1] == f"/k/scripts/{script}"
    assert list(_flag_values(kj["argv"]).values()) == PLACEHOLDERS
    assert kj["metadata"]["kernel_provisioner"] == {
        "provisioner_name": provisioner, "config": {"image_name": "trikernel/kernel-py:0.1.0"},
    }  # fmt: skip
    assert kj["env"] == {"TRIKERNEL_SOCKET_OPTIONS": "*.LINGER=0"}  # GP copies the launcher's env into the pod


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gateway": "yarn"}, "^--gateway: expected one of"),
        ({"gateway": "kubernetes"}, "^--image-name: required with --gateway kubernetes"),
        ({"gateway": "docker", "image_name": "x", "process_proxy": True},
         "^--process-proxy: only with --gateway distributed"),
        ({"gateway": "docker", "image_name": "x", "remote_hosts": ("h",)}, "^--remote-hosts: only with"),
        ({"gateway": "distributed", "port_range": "5..1"}, "^--port-range: "),
        ({"gateway": "distributed", "launch_timeout": 0}, "^--launch-timeout: "),
    ],
)  # fmt: skip
def test_bad_gateway_spec_names_the_option(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        gatewayspec.GatewaySpec(**kwargs)


def _install(prefix: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trikernel", "install", "--prefix", str(prefix), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_install_gateway_distributed_and_kubernetes(tmp_path: Path) -> None:
    r = _install(tmp_path, "--gateway", "distributed", "--remote-hosts", "h1,h2", "h3", "--port-range", "40000..41000")
    assert r.returncode == 0, r.stderr
    kdir = tmp_path / "share" / "jupyter" / "kernels"
    kj = json.loads((kdir / "trikernel-distributed" / "kernel.json").read_text())
    assert kj["metadata"]["kernel_provisioner"]["config"]["remote_hosts"] == ["h1", "h2", "h3"]
    assert kj["argv"][0] == sys.executable

    r = _install(tmp_path, "--gateway", "kubernetes", "--image-name", "img:1", "--name", "tk8s")
    assert r.returncode == 0, r.stderr
    kj = json.loads((kdir / "tk8s" / "kernel.json").read_text())
    script = Path(kj["argv"][1])
    assert script == kdir / "tk8s" / "scripts" / "launch_kubernetes.py"
    assert script.is_file()
    assert (script.parent / "kernel-pod.yaml.j2").is_file()  # launch_kubernetes.py renders it from its own folder
    assert not (script.parent / "__pycache__").exists()
    assert (kdir / "tk8s" / "logo-64x64.png").exists() == (kdir / "trikernel-distributed" / "logo-64x64.png").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--remote-hosts", "h"], "trikernel: --remote-hosts: only with --gateway"),
        (["--gateway", "distributed", "--handshake"], "trikernel: --handshake: not with --gateway"),
        (["--gateway", "kubernetes"], "trikernel: --image-name: required with --gateway kubernetes"),
    ],
)
def test_install_gateway_bad_options_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    r = _install(tmp_path, *args)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[0].startswith(message), r.stderr


# ---------------------------------------------------------------------------
# The container recipe (no Docker engine here: everything up to it)
# ---------------------------------------------------------------------------


def _fake_python(tmp_path: Path) -> Path:
    """A stand-in interpreter that prints the argv and environment it got as JSON."""
    fake = tmp_path / "fake-python"
    fake.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'JPY_PARENT_PID': os.environ.get('JPY_PARENT_PID')}))\n"
    )
    fake.chmod(0o755)
    return fake


def _bootstrap(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "TRIKERNEL_PYTHON": str(_fake_python(tmp_path))}
    return subprocess.run(
        ["/bin/sh", str(BOOTSTRAP), *args], env={**base, **env}, capture_output=True, text=True, timeout=30, check=False
    )


def test_bootstrap_builds_gateway_launch_from_the_provisioner_env(tmp_path: Path) -> None:
    env = {"KERNEL_ID": "k1", "RESPONSE_ADDRESS": "10.1.1.1:8877", "PUBLIC_KEY": "PK", "PORT_RANGE": "40000..41000",
           "TRANSPORT_ENCRYPTION": "required", "JPY_PARENT_PID": "4242",
           "KERNEL_SPARK_CONTEXT_INIT_MODE": "none"}  # fmt: skip
    r = _bootstrap(tmp_path, env, "--log-level", "DEBUG")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["JPY_PARENT_PID"] is None  # a server pid copied into the container must not reach the kernel
    argv = out["argv"]
    assert argv[:3] == ["-m", "trikernel", "gateway-launch"]
    ns = gateway.launch_parser().parse_args(argv[3:])
    assert gateway.launch_args(ns) == gateway.LaunchArgs(
        "k1", ("10.1.1.1", 8877), "PK", (40000, 41000), "required", "0.0.0.0"
    )
    assert ns.log_level == "DEBUG"
    assert ns.spark_init_mode is None


def test_bootstrap_eg_names_and_defaults(tmp_path: Path) -> None:
    r = _bootstrap(tmp_path, {"KERNEL_ID": "k2", "EG_RESPONSE_ADDRESS": "h:1", "EG_PUBLIC_KEY": "PK",
                              "KERNEL_SPARK_CONTEXT_INIT_MODE": "lazy"})  # fmt: skip
    assert r.returncode == 0, r.stderr
    ns = gateway.launch_parser().parse_args(json.loads(r.stdout)["argv"][3:])
    args = gateway.launch_args(ns)
    assert (args.response_address, args.port_range, args.transport_encryption) == (("h", 1), None, None)
    assert ns.spark_init_mode == "lazy"  # passed on so that the kernel warns


def test_bootstrap_names_every_missing_variable(tmp_path: Path) -> None:
    r = _bootstrap(tmp_path, {"RESPONSE_ADDRESS": "h:1"})
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "bootstrap-kernel.sh: missing environment variable(s): KERNEL_ID PUBLIC_KEY (set by the gateway provisioner)"
    )
    assert r.stdout == ""


def test_dockerfile_copies_what_exists_runs_the_bootstrap_and_not_as_root() -> None:
    lines = [ln.strip() for ln in DOCKERFILE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    copies = [ln.split()[1:-1] for ln in lines if ln.startswith("COPY ")]
    for sources in copies:
        for src in sources:
            assert (REPO / src).exists(), f"Dockerfile copies {src}, which is not in the repository"
    assert ["containers/bootstrap-kernel.sh"] in copies
    cmd = next(ln for ln in lines if ln.startswith("CMD "))
    assert json.loads(cmd[4:]) == ["/usr/local/bin/bootstrap-kernel.sh"]
    user = next(ln for ln in reversed(lines) if ln.startswith("USER "))
    uid, _, gid = user.split()[1].partition(":")
    assert uid not in ("0", "root")
    assert gid not in ("0", "root")
    assert any('"/tmp/trikernel[gateway' in ln for ln in lines)  # cryptography comes with the gateway extra
    assert os.access(BOOTSTRAP, os.X_OK)
