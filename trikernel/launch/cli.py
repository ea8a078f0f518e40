"""Command line: ``python -m trikernel -f FILE [options]`` and ``python -m trikernel install``.

Runs on: the main thread, before any other thread exists.

Start-up (docs/design.md, "Threads and loops"): the file given with ``-f``
picks the mode — A classic (all five ports given: bind exactly those), B
zero or missing ports (bind random ports, write them back atomically), C
JEP 66 registration file (``registration_port`` present: bind random ports,
register with the launcher, then serve). Sockets are bound and registered
before IPython is imported.

Errors in the file, the options or the environment exit with code 2 and
one line naming the field; a port in use or a failed handshake exits with
code 1. Never a traceback. The kernel's tunables come from
:class:`~trikernel.config.KernelConfig`'s fields (one declaration each).

Environment variables read: ``TRIKERNEL_LOG_LEVEL`` (default for
``--log-level``), ``TRIKERNEL_SOCKET_OPTIONS`` (sockopts.py),
``JPY_PARENT_PID`` (iorun.py), ``MPLBACKEND`` (set if unset, shell.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from trikernel import __version__
from trikernel.errors import ConfigError, HandshakeError, TrikernelError
from trikernel.launch.options import (
    EXIT_RUNTIME,
    OneLineParser,
    add_kernel_options,
    configure_logging,
    fail,
    kernel_config,
    level_name,
    warn_if_others_can_read,
    warn_without_curve,
)
from trikernel.protocol.channels import PORT_FIELDS
from trikernel.protocol.connection import load_json_file, parse_connection, write_json_atomic

if TYPE_CHECKING:
    from collections.abc import Sequence

    from trikernel.launch.config import KernelConfig

log = logging.getLogger("trikernel.cli")


#: What ``python -m trikernel --help`` lists besides running a kernel.
SUBCOMMANDS = """
  python -m trikernel install [--user|--sys-prefix|--prefix P] [--name N] ...
      write a kernelspec for this interpreter (install --help)
  python -m trikernel gateway-launch --kernel-id ID --response-address IP:PORT ...
      the kernel side of gateway_provisioners / Enterprise Gateway (gateway-launch --help)
"""


def docs_dir() -> str:
    """Where the docs installed with trikernel are: ``trikernel/_docs`` in the
    wheel (README.md and docs/*.md), else the source tree's ``docs/``."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    installed = os.path.join(here, "_docs")
    if os.path.isdir(installed):
        return installed
    return os.path.join(os.path.dirname(here), "docs")


def _run_parser() -> argparse.ArgumentParser:
    # allow_abbrev off: ipykernel's --iopub, --shell, --control must never
    # be taken for a prefix of trikernel's --iopub-capacity and the like
    p = OneLineParser(
        prog="python -m trikernel",
        description="trikernel: a Jupyter kernel for Python on trio. Started by a Jupyter client "
        "with -f CONNECTION_FILE; IPython's options (--Class.trait=value, --profile, --profile-dir, "
        "--matplotlib, -c, ...) are taken as ipykernel takes them. The other commands are below.",
        epilog=f"commands:{SUBCOMMANDS}\ndocs (installed with trikernel): {docs_dir()}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("--version", action="version", version=f"trikernel {__version__}")
    p.add_argument(
        "-f", "--connection-file", dest="connection_file", required=True, help="connection or registration file"
    )
    add_kernel_options(p)
    return p


def _install_parser() -> argparse.ArgumentParser:
    from trikernel.launch import gatewayspec
    from trikernel.server import sockopts

    p = OneLineParser(prog="python -m trikernel install", description="install the trikernel kernelspec")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user")
    where.add_argument("--sys-prefix", action="store_true", help="install into sys.prefix (the active env)")
    where.add_argument("--prefix", help="install under this prefix")
    p.add_argument("--name", default="trikernel", help="kernelspec name: letters, digits, . - _ (default %(default)s)")
    p.add_argument(
        "--display-name",
        default=None,
        help="display name (default: 'Python 3 (trikernel)' for --name trikernel, "
        "'Python 3 (trikernel, as NAME)' for any other name)",
    )
    p.add_argument("--interrupt-mode", choices=["signal", "message"], default="signal")
    p.add_argument(
        "--handshake",
        action="store_true",
        help="select the trikernel-handshake provisioner in the kernelspec (JEP 66 start-up)",
    )
    sockopts.add_arguments(p)
    gatewayspec.add_install_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m trikernel`` and the ``trikernel`` script; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["install"]:
        return _install(args[1:])
    if args[:1] == ["gateway-launch"]:
        from trikernel.launch.gateway import launch

        return launch(args[1:])
    return _run(args)


def _install(argv: list[str]) -> int:
    from trikernel.launch import gatewayspec, kernelspec
    from trikernel.server import sockopts

    args = _install_parser().parse_args(argv)
    try:
        options = sockopts.resolve(args.socket_options or [], {}, args.config)
        gateway = gatewayspec.spec_from_args(args, options)  # None without --gateway
    except ConfigError as exc:
        return fail(str(exc))
    # The effective values of --socket-option and --config are baked into
    # argv; TRIKERNEL_SOCKET_OPTIONS is read when the kernel starts.
    prefix = sys.prefix if args.sys_prefix else args.prefix
    name = gatewayspec.default_name(gateway.gateway) if gateway and args.name == kernelspec.KERNEL_NAME else args.name
    try:
        if gateway is not None:
            dest = gatewayspec.install(
                gateway,
                user=args.user,
                prefix=prefix,
                name=name,
                display_name=args.display_name,
                interrupt_mode=args.interrupt_mode,
            )
        else:
            dest = kernelspec.install(
                user=args.user,
                prefix=prefix,
                name=name,
                display_name=args.display_name,
                extra_argv=options.as_argv(),
                interrupt_mode=args.interrupt_mode,
                handshake=args.handshake,
            )
    except ConfigError as exc:
        return fail(str(exc))
    except ValueError as exc:  # jupyter_client's kernel name check
        return fail(f"--name: {name!r} is not a valid kernelspec name ({exc})")
    except OSError as exc:
        where = f"--prefix {prefix}" if prefix else ("--user" if args.user else "the system kernelspec folder")
        return fail(f"cannot install into {where}: {exc.strerror or exc}", EXIT_RUNTIME)
    print(f"Installed kernelspec {name} in {dest}")
    print(f"  it runs {sys.executable}: a Jupyter server in another environment can use it as it is")
    if name == kernelspec.IPYKERNEL_NAME and gateway is None:
        print(
            "  it replaced ipykernel's python3 kernelspec there, if there was one: "
            "`pip uninstall ipykernel` deletes this kernel.json and reinstalling or upgrading ipykernel "
            "puts ipykernel's back; `pip uninstall trikernel` leaves it naming a missing module. "
            "To undo it: `python -m ipykernel install` with the same location flag (e.g. --sys-prefix)"
        )
    if args.handshake:
        print(
            "  --handshake: the spec names the 'trikernel-handshake' provisioner, which jupyter_client "
            "finds only where trikernel is installed: a server in another environment skips this spec "
            "(its log says 'referencing a kernel provisioner ... that is not available') unless it "
            "runs `pip install trikernel` there too; without --handshake the spec works everywhere"
        )
    return 0


def _parse_run_args(argv: list[str]) -> tuple[argparse.Namespace, KernelConfig, tuple[str, ...]]:
    """Parse argv and the environment: trikernel's options, then the rest as
    IPython's options the way ipykernel takes them (stage 1, before bind:
    user/ipyoptions.py; they are read again in the user run). ``--debug``,
    ``--quiet`` and ``--Application.log_level`` set the kernel's log level
    when ``--log-level`` is not given.

    Returns:
        The namespace, the KernelConfig and the IPython arguments, in order.

    Raises:
        ConfigError: naming the field (an option neither trikernel's nor IPython's too).
    """
    args, rest = _run_parser().parse_known_args(_route_config(argv))
    if rest:
        from trikernel.user import ipyoptions  # traitlets, only for a command line that has IPython options

        level = ipyoptions.log_level_of(ipyoptions.check(rest))
        if level is not None and args.log_level is None:
            args.log_level = level_name(level)
    return args, kernel_config(args), tuple(rest)


def _route_config(argv: list[str]) -> list[str]:
    """``--config FILE`` is trikernel's socket-option file for a ``.toml``
    FILE; any other FILE is IPython's (``BaseIPythonApplication.extra_config_file``,
    as ipykernel takes it)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        value = None
        if arg == "--config" and i + 1 < len(argv):
            value, i = argv[i + 1], i + 1
        elif arg.startswith("--config="):
            value = arg.partition("=")[2]
        if value is None:
            out.append(arg)
        elif value.endswith(".toml"):
            out += ["--config", value]
        else:
            out.append(f"--BaseIPythonApplication.extra_config_file={value}")
        i += 1
    return out


def _run(argv: list[str]) -> int:
    from trikernel.protocol import handshake
    from trikernel.server import sockopts

    # Interrupts may come as soon as the kernel answers kernel_info, before
    # the user run has its SIGINT handler: hold them back until it has
    # (userrun._protected_setup unblocks). Threads started from here on
    # inherit the mask; SIGINT is the main thread's.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})

    try:
        args, config, ipython_argv = _parse_run_args(argv)
    except ConfigError as exc:
        return fail(str(exc))
    configure_logging(args.log_level)
    path = args.connection_file
    try:
        options = sockopts.resolve(
            args.socket_options or [], os.environ, args.config, max_topic_bytes=config.max_topic_bytes
        )
        raw = load_json_file(path)
        registration = None
        try:
            if handshake.is_registration_file(raw):
                registration = handshake.parse_registration(raw)
                conn = parse_connection({**raw, "ip": handshake.bind_ip(raw), **dict.fromkeys(PORT_FIELDS, 0)})
            else:
                conn = parse_connection(raw)
        except ConfigError as exc:
            raise ConfigError(f"connection file {path!r}: {exc}") from None
    except ConfigError as exc:
        return fail(str(exc))

    what = "registration file" if registration is not None else "connection file"
    warn_if_others_can_read(path, what, bool(conn.key or conn.curve_secretkey), log)
    warn_without_curve(conn, log)

    try:  # --strict, --message-log (strict.py, messagelog.py): a missing extra or a bad file stops us here
        from trikernel.protocol.strict import load as load_strict
        from trikernel.server.messagelog import MessageLog

        strict = load_strict() if config.strict else None
        message_log = (
            MessageLog.open(
                config.message_log,
                conn,
                strict=config.strict,
                content_bytes=config.message_log_content,
                capacity=config.message_log_queue,
            )
            if config.message_log
            else None
        )
    except ConfigError as exc:
        return fail(str(exc))

    from trikernel.server.sockets import create_and_bind

    def configure(sock: Any, channel: str) -> None:
        sockopts.apply_options(sock, channel, options)

    try:
        bound = create_and_bind(conn, configure)
    except ConfigError as exc:
        return fail(str(exc))
    except TrikernelError as exc:
        return fail(str(exc), EXIT_RUNTIME)
    conn = conn.with_ports(bound.ports)

    try:
        if registration is not None:
            from trikernel.protocol.wire import Signer
            from trikernel.server.registration import register

            register(
                registration, bound.ports, Signer(conn.key, conn.signature_scheme), timeout=config.handshake_timeout
            )
        elif not all(isinstance(raw.get(k), int) and raw[k] > 0 for k in PORT_FIELDS):
            write_json_atomic(path, {**raw, **bound.ports})
        if args.write_connection_file:
            write_json_atomic(args.write_connection_file, conn.to_dict())
    except (HandshakeError, OSError) as exc:
        bound.destroy()
        return fail(f"start-up failed: {exc}", EXIT_RUNTIME)

    from trikernel.launch.kernel import Kernel

    nodrop = bool(dict(options.for_channel("iopub")).get("XPUB_NODROP", 1))
    # the file a client can attach with (%connect_info): a registration file holds no ports
    usable = args.write_connection_file if registration is not None else path
    connection_file = os.path.abspath(usable) if usable else None
    return Kernel(
        conn,
        config,
        bound,
        iopub_nodrop=nodrop,
        connection_file=connection_file,
        strict=strict,
        message_log=message_log,
        ipython_argv=ipython_argv,
    ).run()
