"""Command line: ``python -m trikernel -f FILE [options]`` and ``python -m trikernel install``.

Start-up (docs/design.md, "Threads and loops"): the file given with ``-f`` picks the mode —
A classic (all five ports given: bind exactly those), B zero ports (bind
random ports, write them back atomically), C JEP 66 registration file
(``registration_port`` present: bind random ports, register with the
launcher, then serve). Sockets are bound and registered before IPython is
imported. Errors in the file or options exit with code 2 and one line
naming the field; a port in use or a failed handshake exits with code 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from .config import KernelConfig, load_json_file, parse_connection, write_json_atomic
from .errors import ConfigError, HandshakeError, TrikernelError

log = logging.getLogger("trikernel.cli")

EXIT_CONFIG = 2
_DEFAULTS = KernelConfig()
EXIT_RUNTIME = 1


def _run_parser() -> argparse.ArgumentParser:
    from . import sockopts

    p = argparse.ArgumentParser(prog="python -m trikernel", description="trikernel: a Jupyter kernel on trio")
    p.add_argument(
        "-f", "--connection-file", dest="connection_file", required=True, help="connection or registration file"
    )
    p.add_argument(
        "--log-level",
        default=os.environ.get("TRIKERNEL_LOG_LEVEL", "WARNING"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="kernel log level (stderr)",
    )
    p.add_argument(
        "--iopub-capacity",
        type=int,
        default=_DEFAULTS.iopub_capacity,
        help="IOPub queue size in messages before producers block (default %(default)s)",
    )
    p.add_argument(
        "--iopub-send-timeout",
        type=float,
        default=_DEFAULTS.iopub_send_timeout,
        help="seconds a full subscriber is waited for before it loses a message (default %(default)s)",
    )
    p.add_argument(
        "--iopub-warn-after",
        type=float,
        default=_DEFAULTS.iopub_warn_after,
        help="seconds of waiting before a warning is logged (default %(default)s)",
    )
    p.add_argument(
        "--stream-batch-bytes",
        type=int,
        default=_DEFAULTS.stream_batch_bytes,
        help="largest coalesced stream message (default %(default)s)",
    )
    p.add_argument(
        "--handshake-timeout",
        type=float,
        default=_DEFAULTS.handshake_timeout,
        help="seconds to wait for the JEP 66 acknowledgement (default %(default)s)",
    )
    p.add_argument(
        "--shutdown-grace",
        type=float,
        default=_DEFAULTS.shutdown_grace,
        help="seconds user code gets to stop at shutdown (default %(default)s)",
    )
    p.add_argument(
        "--max-frames",
        type=int,
        default=_DEFAULTS.max_frames,
        help="most frames in one incoming message; more is dropped unparsed (default %(default)s)",
    )
    p.add_argument(
        "--max-json-bytes",
        type=int,
        default=_DEFAULTS.max_json_bytes,
        help="largest incoming header/parent_header/metadata/content frame in bytes (default %(default)s)",
    )
    p.add_argument(
        "--max-json-depth",
        type=int,
        default=_DEFAULTS.max_json_depth,
        help="deepest nesting of arrays/objects in an incoming JSON frame (default %(default)s)",
    )
    p.add_argument(
        "--max-topic-bytes",
        type=int,
        default=_DEFAULTS.max_topic_bytes,
        help="longest IOPub subscription topic that gets an iopub_welcome (default %(default)s)",
    )
    p.add_argument(
        "--bad-input-log-interval",
        type=float,
        default=_DEFAULTS.bad_input_log_interval,
        help="seconds between summary lines of dropped bad input (default %(default)s)",
    )
    p.add_argument(
        "--no-capture-fd",
        dest="capture_fds",
        action="store_false",
        help="leave file descriptors 1 and 2 alone: output of subprocesses and C code then goes to the "
        "kernel's terminal instead of the notebook",
    )
    p.add_argument(
        "--write-connection-file",
        metavar="PATH",
        help="after start-up (and the handshake), write a connection file here",
    )
    sockopts.add_arguments(p)
    return p


def _install_parser() -> argparse.ArgumentParser:
    from . import sockopts

    p = argparse.ArgumentParser(prog="python -m trikernel install", description="install the trikernel kernelspec")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user")
    where.add_argument("--sys-prefix", action="store_true", help="install into sys.prefix (the active env)")
    where.add_argument("--prefix", help="install under this prefix")
    p.add_argument("--name", default="trikernel", help="kernelspec name (default %(default)s)")
    p.add_argument("--display-name", default=None, help="display name")
    p.add_argument("--interrupt-mode", choices=["signal", "message"], default="signal")
    p.add_argument(
        "--handshake",
        action="store_true",
        help="select the trikernel-handshake provisioner in the kernelspec (JEP 66 start-up)",
    )
    sockopts.add_arguments(p)
    return p


def _configure_logging(level: str) -> None:
    """The kernel's own log goes to the real stderr (the kernel's terminal,
    never the notebook). Only the ``trikernel`` logger is configured: the
    root logger stays the user's, so ``logging.warning(...)`` in a cell (and
    libraries' logs, e.g. comm's errors in widget handlers) reach the
    notebook's stderr as in ipykernel, and ``logging.basicConfig`` in a
    cell works."""
    handler = logging.StreamHandler(sys.__stderr__)
    handler.setFormatter(logging.Formatter("[trikernel %(levelname)s %(name)s] %(message)s"))
    kernel_log = logging.getLogger("trikernel")
    kernel_log.addHandler(handler)
    kernel_log.setLevel(getattr(logging, level))
    kernel_log.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["install"]:
        return _install(args[1:])
    return _run(args)


def _install(argv: list[str]) -> int:
    from . import kernelspec, sockopts

    args = _install_parser().parse_args(argv)
    try:
        options = sockopts.resolve(args.socket_options or [], {}, args.config)
    except ConfigError as exc:
        print(f"trikernel: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    # The effective values of --socket-option and --config are baked into
    # argv; TRIKERNEL_SOCKET_OPTIONS is read when the kernel starts.
    extra = options.as_argv()
    prefix = sys.prefix if args.sys_prefix else args.prefix
    dest = kernelspec.install(
        user=args.user,
        prefix=prefix,
        name=args.name,
        display_name=args.display_name or kernelspec.DISPLAY_NAME,
        extra_argv=extra,
        interrupt_mode=args.interrupt_mode,
        handshake=args.handshake,
    )
    print(f"Installed kernelspec {args.name} in {dest}")
    return 0


def _run(argv: list[str]) -> int:
    from . import sockopts

    args = _run_parser().parse_args(argv)
    _configure_logging(args.log_level)
    try:
        config = KernelConfig(
            iopub_capacity=args.iopub_capacity,
            iopub_send_timeout=args.iopub_send_timeout,
            iopub_warn_after=args.iopub_warn_after,
            stream_batch_bytes=args.stream_batch_bytes,
            handshake_timeout=args.handshake_timeout,
            shutdown_grace=args.shutdown_grace,
            capture_fds=args.capture_fds,
            max_frames=args.max_frames,
            max_json_bytes=args.max_json_bytes,
            max_json_depth=args.max_json_depth,
            max_topic_bytes=args.max_topic_bytes,
            bad_input_log_interval=args.bad_input_log_interval,
        )
        options = sockopts.resolve(args.socket_options or [], os.environ, args.config)
        raw = load_json_file(args.connection_file)
        registration = None
        from . import handshake

        if handshake.is_registration_file(raw):
            registration = handshake.parse_registration(raw)
            conn = parse_connection(
                {
                    **raw,
                    "ip": handshake.bind_ip(raw),
                    **{k: 0 for k in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")},
                },
                require_ports=False,
            )
        else:
            conn = parse_connection(raw)
    except ConfigError as exc:
        print(f"trikernel: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    if conn.transport == "tcp" and not conn.curve:
        log.warning("CurveZMQ keys absent: kernel traffic on %s is not encrypted (only signed)", conn.ip)

    from .sockets import create_and_bind

    def configure(sock: object, channel: str) -> None:
        sockopts.apply_options(sock, channel, options)  # type: ignore[arg-type]

    try:
        bound = create_and_bind(conn, configure)
    except ConfigError as exc:
        print(f"trikernel: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except TrikernelError as exc:
        print(f"trikernel: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    conn = conn.with_ports(bound.ports)

    try:
        if registration is not None:
            from .wire import Signer

            handshake.register(
                registration, bound.ports, Signer(conn.key, conn.signature_scheme), timeout=config.handshake_timeout
            )
        elif not all(p > 0 for p in (raw.get(k, 0) for k in bound.ports)):
            write_json_atomic(args.connection_file, {**raw, **bound.ports})
        if args.write_connection_file:
            write_json_atomic(args.write_connection_file, conn.to_dict())
    except (HandshakeError, OSError) as exc:
        print(f"trikernel: start-up failed: {exc}", file=sys.stderr)
        bound.destroy()
        return EXIT_RUNTIME

    from .kernel import Kernel

    nodrop = bool(dict(options.for_channel("iopub")).get("XPUB_NODROP", 1))
    return Kernel(conn, config, bound, iopub_nodrop=nodrop).run()
