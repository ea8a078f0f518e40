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

The protocol's pure parts (flags' values, the payload, comm-port requests)
are ``trikernel.protocol.gateway``; the comm-port server is
``trikernel.server.commport``. :func:`launch` runs on the main thread,
before IPython is imported, like the JEP 66 registration in cli.py.

Runs on: the main thread, at start-up, before IPython is imported (parse,
bind, the blocking payload send, then ``Kernel.run``); the comm-port
callbacks ``on_signal`` and ``on_shutdown`` run in the io run.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from trikernel.errors import ConfigError, TrikernelError
from trikernel.protocol.connection import ConnectionInfo
from trikernel.protocol.gateway import (
    build_payload,
    connection_info,
    is_placeholder,
    load_public_key,
    parse_port_range,
    parse_response_address,
    parse_transport_encryption,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from trikernel.launch.config import KernelConfig
    from trikernel.server.sockets import BoundSockets

log = logging.getLogger("trikernel.gateway")

#: Address the kernel binds by default: every interface, as the stock launchers do
#: (the server connects to the host address it launched on).
DEFAULT_BIND_IP = "0.0.0.0"
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


# ---------------------------------------------------------------------------
# Flags
# ---------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError (one line, no usage dump) instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def launch_parser() -> argparse.ArgumentParser:
    """The ``gateway-launch`` parser: the launcher flags GP and EG pass, plus the kernel's options."""
    from trikernel.launch import options

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
    options.add_kernel_options(p)
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


# ---------------------------------------------------------------------------
# Blocking parts (main thread, at start-up)
# ---------------------------------------------------------------------------


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

    from trikernel.launch import options as opts
    from trikernel.server import commport, sockopts

    # As in cli._run: interrupts are held back until the user run has its
    # SIGINT handler (userrun._protected_setup unblocks); threads inherit this.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        ns = launch_parser().parse_args(list(argv))
        config = opts.kernel_config(ns)
    except ConfigError as exc:
        return opts.fail(str(exc))
    opts.configure_logging(ns.log_level)
    try:
        args = launch_args(ns)
        options = sockopts.resolve(
            ns.socket_options or [], os.environ, ns.config, max_topic_bytes=config.max_topic_bytes
        )
        public_key = load_public_key(args.public_key)
        conn = _connection(args)
    except ConfigError as exc:
        return opts.fail(str(exc))
    for flag in ignored_flags(ns):
        log.debug("ignored %s (a flag of ipykernel's launcher)", flag)
    if ns.spark_init_mode not in (None, "none"):
        log.warning(
            "ignored --spark-context-initialization-mode=%s: trikernel creates no Spark context", ns.spark_init_mode
        )
    opts.warn_without_curve(conn, log)

    from trikernel.server.sockets import create_and_bind

    def configure(sock: Any, channel: str) -> None:
        sockopts.apply_options(sock, channel, options)

    try:
        bound = create_and_bind(conn, configure, port_range=args.port_range)
    except ConfigError as exc:
        return opts.fail(str(exc))
    except TrikernelError as exc:
        return opts.fail(str(exc), opts.EXIT_RUNTIME)
    conn = conn.with_ports(bound.ports)
    try:
        comm = commport.bind_comm_listener(conn.ip, args.port_range)
    except (TrikernelError, OSError) as exc:
        bound.destroy()
        return opts.fail(f"cannot bind the comm port: {exc}", opts.EXIT_RUNTIME)
    try:
        info = connection_info(
            conn, kernel_id=args.kernel_id, comm_port=comm.getsockname()[1], pid=os.getpid(), pgid=os.getpgid(0)
        )
        log.debug("sending ports %s, comm port %d to %s:%d", bound.ports, info["comm_port"], *args.response_address)
        send_payload(args.response_address, build_payload(info, public_key), timeout=config.handshake_timeout)
        if ns.write_connection_file:
            from trikernel.protocol.connection import write_json_atomic

            write_json_atomic(ns.write_connection_file, conn.to_dict())
    except OSError as exc:
        host, port = args.response_address
        comm.close()
        bound.destroy()
        return opts.fail(f"start-up failed: response address {host}:{port}: {exc}", opts.EXIT_RUNTIME)
    return _run_kernel(conn, config, bound, comm, nodrop=bool(dict(options.for_channel("iopub")).get("XPUB_NODROP", 1)))


def _connection(args: LaunchArgs) -> ConnectionInfo:
    """The kernel's connection: fresh HMAC key, ``args.ip``, CurveZMQ keys if the policy asks."""
    import secrets

    pub = sec = None
    if args.transport_encryption is not None:
        from trikernel.server.sockets import curve_keypair

        keys = curve_keypair()
        if keys is not None:
            pub, sec = keys
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

    from trikernel.launch.kernel import Kernel
    from trikernel.server import commport

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
