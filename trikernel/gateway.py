"""``python -m trikernel gateway-launch``: the kernel side of gateway_provisioners and Enterprise Gateway.

gateway_provisioners 0.5.0 (GP: ``DistributedProvisioner`` over SSH, and
its Kubernetes, Docker, Docker Swarm and YARN provisioners) and Jupyter
Enterprise Gateway 3.3.0 (EG: the same as ``process_proxy`` classes) start
a remote kernel through a *launcher*; they agree on this protocol
(GP ``kernel-launchers/shared/scripts/server_listener.py``,
``response_manager.py``, ``remote_provisioner.py``; EG
``etc/kernel-launchers/python/scripts/launch_ipykernel.py``,
``services/processproxies/processproxy.py``):

- The kernelspec ``argv`` carries ``{kernel_id}``, ``{response_address}``,
  ``{public_key}``, ``{port_range}`` (and, GP only, ``{transport_encryption}``);
  the launcher gets ``--kernel-id ID --response-address IP:PORT
  --public-key B64 --port-range L..U [--transport-encryption POLICY]``
  (EG's own kernelspecs spell them ``--RemoteProcessProxy.kernel-id`` ...).
- The launcher sends ONE payload over TCP to the response address and
  closes: base64 of JSON ``{"version": 1, "key": K, "conn_info": C}``; K is
  base64 of a random 16-byte AES key encrypted with the server's RSA
  public key (PKCS#1 v1.5), C is base64 of the connection info JSON
  encrypted with AES-128-ECB, PKCS#7-padded. The connection info holds the
  five ``*_port``, ``ip``, ``key``, ``transport``, ``signature_scheme``,
  ``kernel_name``, ``pid``, ``pgid``, ``comm_port``, ``kernel_id``, and
  ``curve_publickey``/``curve_secretkey`` when transport encryption is on.
  The server does not check ports against the range.
- The server then uses the launcher's *comm port* (see trikernel.commport).

What trikernel does differently from the stock launchers: it binds the
five ZeroMQ sockets and the comm socket FIRST and keeps them (random ports,
or random ports within ``--port-range`` with a retry on "address in use"),
then sends the ports it actually holds; and it serves the comm port as a
task of its own io run instead of a forked listener. So there is no window
in which another process can take a reported port, no child process to
become a zombie, and no listener outlives the kernel.

Everything here up to :func:`bind_comm_listener` is pure (strings, bytes
and dicts in and out; ``cryptography`` is imported only by the payload
functions). :func:`launch` runs on the main thread, before IPython is
imported, like the JEP 66 registration in cli.py.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import re
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from .config import ConnectionInfo
from .errors import ConfigError, ProtocolError, TrikernelError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey

    from .config import KernelConfig
    from .sockets import BoundSockets

log = logging.getLogger("trikernel.gateway")

#: The payload version GP 0.5.0 and EG 3.3.0 launchers send and servers accept.
LAUNCHER_VERSION = 1
#: Address the kernel binds by default: every interface, as the stock launchers do
#: (the server connects to the host address it launched on).
DEFAULT_BIND_IP = "0.0.0.0"
#: Listen backlog of the comm socket.
COMM_BACKLOG = 16
#: A placeholder the server did not substitute, e.g. ``{transport_encryption}`` from EG 3.3.0.
_PLACEHOLDER = re.compile(r"^\{[A-Za-z0-9_]+\}$")
#: Transport-encryption policies that ask for CurveZMQ keys.
ENCRYPTION_POLICIES = ("auto", "required")
#: Launcher flags that only matter to ipykernel's launcher; accepted and ignored.
IGNORED_FLAGS = {
    "spark_init_mode": "--spark-context-initialization-mode",
    "cluster_type": "--cluster-type",
    "kernel_class_name": "--kernel-class-name",
}


@dataclass(frozen=True, slots=True)
class LaunchArgs:
    """The launcher flags, validated.

    - ``kernel_id``: the server's kernel id (echoed in the payload).
    - ``response_address``: ``(host, port)`` of the server's response socket.
    - ``public_key``: the server's RSA public key as given (base64 DER).
    - ``port_range``: ``(lower, upper)`` inclusive, or None for "any port".
    - ``transport_encryption``: "auto", "required" or None (no CurveZMQ).
    - ``ip``: the address the kernel binds.
    """

    kernel_id: str
    response_address: tuple[str, int]
    public_key: str
    port_range: tuple[int, int] | None
    transport_encryption: str | None
    ip: str = DEFAULT_BIND_IP


@dataclass(frozen=True, slots=True)
class CommRequest:
    """One comm-port request: ``signum`` (None if absent) and ``shutdown``."""

    signum: int | None
    shutdown: bool


# ---------------------------------------------------------------------------
# Flags
# ---------------------------------------------------------------------------


def is_placeholder(value: str | None) -> bool:
    """True for an argv placeholder the server left unsubstituted, e.g. ``{port_range}``."""
    return value is not None and bool(_PLACEHOLDER.match(value.strip()))


def parse_port_range(value: str | None, *, name: str = "--port-range") -> tuple[int, int] | None:
    """``"L..U"`` -> ``(L, U)``; None for "any port".

    Any port: absent, empty, an unsubstituted placeholder, or a range of
    size zero (``0..0``, ``N..N``: GP's "port-range enforcement disabled").
    Raises ConfigError naming ``name`` for a malformed range, ports outside
    1..65535, or L > U. The range size is the server's to police (GP and
    EG require at least 1000 ports); any non-empty range works here.
    """
    if value is None or not value.strip() or is_placeholder(value):
        return None
    parts = value.strip().split("..")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ConfigError(f"{name}: expected LOWER..UPPER (e.g. 40000..41000 or 0..0), got {value!r}")
    lower, upper = (int(p) for p in parts)
    if lower == upper:
        return None
    if lower > upper:
        raise ConfigError(f"{name}: lower port {lower} is above upper port {upper}")
    if lower < 1 or upper > 65535:
        raise ConfigError(f"{name}: ports must be in 1..65535, got {value!r}")
    return lower, upper


def parse_response_address(value: str | None, *, name: str = "--response-address") -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``) -> ``(host, port)``; ConfigError naming ``name``."""
    if value is None or not value.strip():
        raise ConfigError(f"{name}: missing (the server passes it as {{response_address}})")
    if is_placeholder(value):
        raise ConfigError(f"{name}: got the unsubstituted placeholder {value!r}; is a gateway provisioner launching?")
    host, sep, port = value.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"{name}: expected HOST:PORT, got {value!r}")
    return host, int(port)


def parse_transport_encryption(value: str | None, *, name: str = "--transport-encryption") -> str | None:
    """The policy: "auto" or "required" (CurveZMQ keys wanted), or None.

    None for: absent, empty (GP substitutes "" when encryption is off),
    "disabled", or an unsubstituted ``{transport_encryption}`` (EG 3.3.0 and
    older GP do not know it). Case-insensitive. Raises ConfigError naming
    ``name`` for any other value (a policy that is not understood must not
    silently fall back to plaintext).
    """
    if value is None or is_placeholder(value):
        return None
    policy = value.strip().lower()
    if policy in ("", "disabled"):
        return None
    if policy not in ENCRYPTION_POLICIES:
        raise ConfigError(f"{name}: expected auto, required or disabled, got {value!r}")
    return policy


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError (one line, no usage dump) instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def launch_parser() -> argparse.ArgumentParser:
    """The ``gateway-launch`` parser: the launcher flags GP and EG pass, plus the kernel's options."""
    from . import cli

    p = _Parser(
        prog="python -m trikernel gateway-launch",
        description="trikernel launched by gateway_provisioners or Jupyter Enterprise Gateway",
    )
    # nargs="?" as in the stock launchers: over SSH, GP joins argv into a shell
    # command without quoting, so an empty value ({transport_encryption} when
    # encryption is off) arrives as a flag with no value at all.
    g = p.add_argument_group("launcher flags (substituted by the server from the kernelspec argv)")
    g.add_argument("--kernel-id", "--RemoteProcessProxy.kernel-id", dest="kernel_id", nargs="?", metavar="ID")
    g.add_argument(
        "--response-address",
        "--RemoteProcessProxy.response-address",
        dest="response_address",
        nargs="?",
        metavar="IP:PORT",
    )
    g.add_argument("--public-key", "--RemoteProcessProxy.public-key", dest="public_key", nargs="?", metavar="B64")
    g.add_argument("--port-range", "--RemoteProcessProxy.port-range", dest="port_range", nargs="?", metavar="L..U")
    g.add_argument("--transport-encryption", dest="transport_encryption", nargs="?", metavar="POLICY")
    g.add_argument(
        "--ip",
        default=DEFAULT_BIND_IP,
        help="address the kernel and its comm port bind (default %(default)s, as the stock launcher)",
    )
    ig = p.add_argument_group("accepted for compatibility with ipykernel's launcher and ignored")
    ig.add_argument(
        "--spark-context-initialization-mode",
        "--RemoteProcessProxy.spark-context-initialization-mode",
        dest="spark_init_mode",
        nargs="?",
        metavar="MODE",
    )
    ig.add_argument(
        "--cluster-type", "--RemoteProcessProxy.cluster-type", dest="cluster_type", nargs="?", metavar="TYPE"
    )
    ig.add_argument("--kernel-class-name", dest="kernel_class_name", nargs="?", metavar="NAME")
    cli.add_kernel_options(p)
    return p


def launch_args(ns: argparse.Namespace) -> LaunchArgs:
    """Validate the launcher flags of a parsed namespace; ConfigError names the flag."""
    kernel_id = ns.kernel_id
    if kernel_id is None or not kernel_id.strip():
        raise ConfigError("--kernel-id: missing (the server passes it as {kernel_id})")
    if is_placeholder(kernel_id):
        raise ConfigError(f"--kernel-id: got the unsubstituted placeholder {kernel_id!r}")
    if ns.public_key is None or not ns.public_key.strip() or is_placeholder(ns.public_key):
        raise ConfigError("--public-key: missing (the server passes it as {public_key})")
    return LaunchArgs(
        kernel_id=kernel_id.strip(),
        response_address=parse_response_address(ns.response_address),
        public_key=ns.public_key.strip(),
        port_range=parse_port_range(ns.port_range),
        transport_encryption=parse_transport_encryption(ns.transport_encryption),
        ip=ns.ip,
    )


def ignored_flags(ns: argparse.Namespace) -> list[str]:
    """``"--flag=value"`` for every ignored ipykernel-launcher flag that was given."""
    return [f"{flag}={getattr(ns, dest)}" for dest, flag in IGNORED_FLAGS.items() if getattr(ns, dest) is not None]


# ---------------------------------------------------------------------------
# The payload
# ---------------------------------------------------------------------------


def _crypto_missing() -> ConfigError:
    return ConfigError(
        "--public-key: encrypting the connection info needs the 'cryptography' package "
        "(pip install 'trikernel[gateway]')"
    )


def load_public_key(value: str, *, name: str = "--public-key") -> RSAPublicKey:
    """The server's RSA public key from base64 DER (SubjectPublicKeyInfo, as GP/EG send
    it: a PEM body without header lines) or a whole PEM. ConfigError naming ``name``."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
    except ImportError:
        raise _crypto_missing() from None
    text = value.strip()
    try:
        if text.startswith("-----BEGIN"):
            key = serialization.load_pem_public_key(text.encode())
        else:
            key = serialization.load_der_public_key(base64.b64decode("".join(text.split()), validate=True))
    except ValueError:
        raise ConfigError(f"{name}: not a base64-encoded RSA public key") from None
    if not isinstance(key, RSAPublicKey):
        raise ConfigError(f"{name}: not an RSA public key ({type(key).__name__})")
    return key


def connection_info(conn: ConnectionInfo, *, kernel_id: str, comm_port: int, pid: int, pgid: int) -> dict[str, Any]:
    """The ``conn_info`` dict of a v1 payload: the connection file fields
    (:meth:`ConnectionInfo.to_dict`, key as str, curve keys when set) plus
    ``pid``, ``pgid``, ``comm_port`` and ``kernel_id``."""
    info = conn.to_dict()
    info.update(pid=pid, pgid=pgid, comm_port=comm_port, kernel_id=kernel_id)
    return info


def build_payload(
    conn_info: Mapping[str, Any], public_key: RSAPublicKey | str, *, version: int = LAUNCHER_VERSION
) -> bytes:
    """The bytes a launcher sends to the response address (module docstring, "payload").

    ``conn_info``: JSON-serialisable (see :func:`connection_info`).
    ``public_key``: the server's key, loaded or as :func:`load_public_key` takes it.
    ``version``: the payload's version field (tests send others to see them refused).
    A fresh random AES key per call. Raises ConfigError if ``cryptography``
    is missing or the key is bad.
    """
    try:
        from cryptography.hazmat.primitives import padding
        from cryptography.hazmat.primitives.asymmetric.padding import PKCS1v15
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    except ImportError:
        raise _crypto_missing() from None
    key = load_public_key(public_key) if isinstance(public_key, str) else public_key
    aes_key = os.urandom(16)
    padder = padding.PKCS7(128).padder()
    plain = padder.update(json.dumps(conn_info).encode("utf-8")) + padder.finalize()
    # ECB because the protocol says so (GP/EG decrypt with AES.MODE_ECB); one
    # key per payload, and the RSA-wrapped key is the secret that matters.
    encryptor = Cipher(algorithms.AES(aes_key), modes.ECB()).encryptor()
    sealed = encryptor.update(plain) + encryptor.finalize()
    payload = {
        "version": version,
        "key": base64.b64encode(key.encrypt(aes_key, PKCS1v15())).decode(),
        "conn_info": base64.b64encode(sealed).decode(),
    }
    return base64.b64encode(json.dumps(payload).encode("utf-8"))


# ---------------------------------------------------------------------------
# The comm-port protocol (served by trikernel.commport)
# ---------------------------------------------------------------------------


def parse_comm_request(data: bytes) -> CommRequest:
    """Parse what one comm-port connection sent: one JSON object.

    ``signum``: an int or decimal string in 0..127 (the stock listeners
    ``int()`` it); ``shutdown``: any JSON value, true when truthy (the stock
    listeners ``bool()`` it). Other keys are ignored. Raises ProtocolError
    for non-UTF-8 or non-JSON data, a non-object, a bad ``signum``, or an
    object with neither key.
    """
    try:
        request = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"not a JSON object: {exc}") from None
    if not isinstance(request, dict):
        raise ProtocolError(f"expected a JSON object, got {type(request).__name__}")
    if "signum" not in request and "shutdown" not in request:
        raise ProtocolError(f"neither 'signum' nor 'shutdown' in request (keys: {sorted(request)[:5]})")
    signum = request.get("signum")
    if signum is not None:
        if isinstance(signum, str) and signum.strip().isdigit():
            signum = int(signum)
        if isinstance(signum, bool) or not isinstance(signum, int) or not 0 <= signum <= 127:
            raise ProtocolError(f"'signum' must be a signal number 0..127, got {request.get('signum')!r}")
    return CommRequest(signum=signum, shutdown=bool(request.get("shutdown")))


# ---------------------------------------------------------------------------
# Blocking parts (main thread, at start-up)
# ---------------------------------------------------------------------------


def bind_comm_listener(ip: str, port_range: tuple[int, int] | None) -> socket.socket:
    """A listening TCP socket for the comm port on ``ip``: any port, or a free one in ``port_range``.

    Bound without SO_REUSEADDR, so the bind alone makes the port this
    socket's (with SO_REUSEADDR, Linux lets a second socket bind the same
    port until one of them listens). Kept: the port reported is the port
    held. Raises BindError (no free port in the range) or OSError.
    """
    from .sockets import bind_in_range

    sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
    try:
        if port_range is None:
            sock.bind((ip, 0))
        else:
            bind_in_range(sock, "comm port", lambda port: (ip, port), port_range)
        sock.listen(COMM_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def send_payload(address: tuple[str, int], payload: bytes, *, timeout: float) -> None:
    """Deliver ``payload`` to the server's response address: connect, send all, close.

    ``timeout``: seconds for the connection and the send. Raises OSError.
    """
    with socket.create_connection(address, timeout=timeout) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)


# ---------------------------------------------------------------------------
# python -m trikernel gateway-launch
# ---------------------------------------------------------------------------


def launch(argv: Sequence[str]) -> int:
    """``python -m trikernel gateway-launch FLAGS``; returns the exit code.

    Bind (five channels, then the comm socket) -> send the payload -> run
    the kernel with the comm port as an io-run service. A bad flag exits 2
    with one line naming it; a bind failure, an unreachable response
    address or a failed kernel exits 1.
    """
    import signal

    from . import cli, sockopts

    # As in cli._run: interrupts are held back until the user run has its
    # SIGINT handler (userrun._protected_setup unblocks); threads inherit this.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        ns = launch_parser().parse_args(list(argv))
        config = cli.kernel_config(ns)
    except ConfigError as exc:
        return cli._fail(str(exc))
    cli._configure_logging(ns.log_level)
    try:
        args = launch_args(ns)
        options = sockopts.resolve(ns.socket_options or [], os.environ, ns.config)
        public_key = load_public_key(args.public_key)
        conn = _connection(args)
    except ConfigError as exc:
        return cli._fail(str(exc))
    for flag in ignored_flags(ns):
        log.debug("ignored %s (a flag of ipykernel's launcher)", flag)
    if ns.spark_init_mode not in (None, "none"):
        log.warning(
            "ignored --spark-context-initialization-mode=%s: trikernel creates no Spark context", ns.spark_init_mode
        )
    if not conn.curve:
        level = logging.INFO if cli._is_loopback(conn.ip) else logging.WARNING
        log.log(level, "CurveZMQ keys absent: kernel traffic on %s is signed, not encrypted", conn.ip)

    from .sockets import create_and_bind

    def configure(sock: Any, channel: str) -> None:
        sockopts.apply_options(sock, channel, options)

    try:
        bound = create_and_bind(conn, configure, port_range=args.port_range)
    except ConfigError as exc:
        return cli._fail(str(exc))
    except TrikernelError as exc:
        return cli._fail(str(exc), cli.EXIT_RUNTIME)
    conn = conn.with_ports(bound.ports)
    try:
        comm = bind_comm_listener(conn.ip, args.port_range)
    except (TrikernelError, OSError) as exc:
        bound.destroy()
        return cli._fail(f"cannot bind the comm port: {exc}", cli.EXIT_RUNTIME)
    try:
        info = connection_info(
            conn, kernel_id=args.kernel_id, comm_port=comm.getsockname()[1], pid=os.getpid(), pgid=os.getpgid(0)
        )
        log.debug("sending ports %s, comm port %d to %s:%d", bound.ports, info["comm_port"], *args.response_address)
        send_payload(args.response_address, build_payload(info, public_key), timeout=config.handshake_timeout)
        if ns.write_connection_file:
            from .config import write_json_atomic

            write_json_atomic(ns.write_connection_file, conn.to_dict())
    except OSError as exc:
        host, port = args.response_address
        comm.close()
        bound.destroy()
        return cli._fail(f"start-up failed: response address {host}:{port}: {exc}", cli.EXIT_RUNTIME)
    return _run_kernel(conn, config, bound, comm, nodrop=bool(dict(options.for_channel("iopub")).get("XPUB_NODROP", 1)))


def _connection(args: LaunchArgs) -> ConnectionInfo:
    """The kernel's connection: fresh HMAC key, ``args.ip``, CurveZMQ keys if the policy asks."""
    import secrets

    pub = sec = None
    if args.transport_encryption is not None:
        import zmq

        if zmq.has("curve"):
            pub, sec = zmq.curve_keypair()
        elif args.transport_encryption == "required":
            raise ConfigError("--transport-encryption: 'required' but this libzmq has no CURVE support")
        else:
            log.warning("--transport-encryption auto: this libzmq has no CURVE support; starting unencrypted")
    return ConnectionInfo(ip=args.ip, key=secrets.token_hex(16).encode(), curve_publickey=pub, curve_secretkey=sec)


def _run_kernel(
    conn: ConnectionInfo, config: KernelConfig, bound: BoundSockets, comm: socket.socket, *, nodrop: bool
) -> int:
    """Main thread: run the kernel with the comm-port service; returns its exit code."""
    import signal

    from . import commport
    from .kernel import Kernel

    valid = signal.valid_signals()
    kernel: Kernel | None = None  # set below, before any request can arrive

    def on_signal(signum: int) -> None:
        """io run: 2 interrupts user code as interrupt_request does; other signals go to this process.

        jupyter_client interrupts a kernel before it shuts it down, and the
        comm port is not ordered with the control channel: an interrupt
        that arrives once the shutdown has begun is dropped (the kernel
        itself interrupts user code that outlasts --shutdown-grace).
        """
        assert kernel is not None
        if signum == signal.SIGINT:
            if kernel.user_run.stopping:
                log.debug("comm port: interrupt during shutdown ignored")
            else:
                kernel.user_run.interrupt()
        elif signum in valid:
            os.kill(os.getpid(), signum)
        else:
            log.warning("comm port: dropped a request for signal %d (not a signal here)", signum)

    def on_shutdown() -> None:
        assert kernel is not None
        kernel.request_shutdown()

    service = commport.service(comm, on_signal=on_signal, on_shutdown=on_shutdown)
    kernel = Kernel(conn, config, bound, iopub_nodrop=nodrop, services=(service,))
    try:
        return kernel.run()
    finally:
        # The server counts the kernel alive while this port accepts
        # connections, so the listening descriptor is left to the process
        # exit: "refused" then means the process has really ended.
        comm.detach()
