"""The kernel's command-line options, shared by ``python -m trikernel`` (cli.py)
and ``python -m trikernel gateway-launch`` (gateway.py).

Runs on: the main thread, before any other thread exists.

The options are derived from :class:`~trikernel.launch.config.KernelConfig`'s
fields (one declaration each) plus ``--log-level``, ``--write-connection-file``
and the socket options (server/sockopts.py). A bad value exits with code 2 and
one line naming the option (:class:`OneLineParser`, :func:`fail`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from trikernel.errors import ConfigError
from trikernel.launch.config import KernelConfig, flag_of

if TYPE_CHECKING:
    from trikernel.protocol.connection import ConnectionInfo

#: Exit code of a start-up that failed at run time (a port in use, a failed handshake).
EXIT_RUNTIME = 1
#: Exit code of a bad option, connection file or environment variable.
EXIT_CONFIG = 2
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_LEVEL_ENV = "TRIKERNEL_LOG_LEVEL"
_TYPES: dict[str, type] = {"int": int, "float": float, "str": str}


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``trikernel: <problem>`` and exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Exit with EXIT_CONFIG and one line naming the problem (no usage dump)."""
        self.exit(EXIT_CONFIG, f"trikernel: {message} (see {self.prog} --help)\n")


def log_level(text: str) -> str:
    """A log level name of LOG_LEVELS, case-insensitive; also what IPython's
    ``--log-level`` takes (ipykernel kernelspecs carry it): ``CRITICAL`` or a
    ``logging`` number (:func:`level_name`). Raises ArgumentTypeError."""
    level = text.strip().upper()
    if level in LOG_LEVELS:
        return level
    if level == "CRITICAL":
        return level_name(logging.CRITICAL)
    if level.isdigit():
        return level_name(int(level))
    raise argparse.ArgumentTypeError(f"must be one of {', '.join(LOG_LEVELS)} (any case), got {text!r}")


def level_name(level: int) -> str:
    """The LOG_LEVELS name for a ``logging`` level number: the quietest that
    still shows everything ``level`` shows (10 → DEBUG, 15 → DEBUG, 20 →
    INFO, 50 → ERROR)."""
    for name in reversed(LOG_LEVELS):
        if getattr(logging, name) <= level:
            return name
    return LOG_LEVELS[0]


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """One option per KernelConfig field, with its type, unit, default and help."""
    for f in dataclasses.fields(KernelConfig):
        flag = flag_of(f)
        if f.type == "bool" or f.type is bool:
            action = "store_false" if f.default else "store_true"
            p.add_argument(flag, dest=f.name, action=action, default=f.default, help=f.metadata["help"])
            continue
        unit = f.metadata["unit"]
        p.add_argument(
            flag,
            dest=f.name,
            type=_TYPES[str(f.type)],
            default=f.default,
            metavar=f.metadata.get("metavar") or {"s": "SECONDS"}.get(unit, unit.upper()) or "N",
            help=f"{f.metadata['help']} ({unit}; default %(default)s)" if unit else f.metadata["help"],
        )


def add_kernel_options(p: argparse.ArgumentParser) -> None:
    """The kernel's options other than ``-f`` (shared with ``gateway-launch``)."""
    from trikernel.server import sockopts

    p.add_argument(
        "--log-level",
        type=log_level,
        default=None,
        help=f"kernel log level on stderr: {', '.join(LOG_LEVELS)}, any case (default: ${LOG_LEVEL_ENV} or WARNING)",
    )
    p.add_argument(
        "--write-connection-file",
        metavar="PATH",
        help="after start-up (and the handshake), write a connection file here",
    )
    add_config_arguments(p)
    sockopts.add_arguments(p)


def kernel_config(args: argparse.Namespace) -> KernelConfig:
    """The KernelConfig of options :func:`add_kernel_options` added (and
    ``--log-level``'s default from the environment, set on ``args``).
    Raises ConfigError naming the field."""
    if args.log_level is None:
        try:
            args.log_level = log_level(os.environ.get(LOG_LEVEL_ENV, "WARNING"))
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"{LOG_LEVEL_ENV}: {exc}") from None
    values: dict[str, Any] = {f.name: getattr(args, f.name) for f in dataclasses.fields(KernelConfig)}
    return KernelConfig(**values)


def configure_logging(level: str) -> None:
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


def fail(message: str, code: int = EXIT_CONFIG) -> int:
    """Print ``trikernel: <message>`` on stderr; returns ``code`` (the exit code)."""
    print(f"trikernel: {message}", file=sys.stderr)
    return code


def is_loopback(ip: str) -> bool:
    """True for addresses only this host can reach (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if ip == "localhost":
        return True
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def warn_without_curve(conn: ConnectionInfo, logger: logging.Logger) -> None:
    """Say once, at start-up, that a TCP kernel runs without CurveZMQ, and what
    that exposes: a warning when it listens beyond loopback, else an info line.

    Without CurveZMQ the messages are signed (HMAC), not encrypted, and an
    IOPub SUB socket needs no key at all: whoever reaches the port reads every
    output, and can subscribe as much as it likes; many distinct
    subscriptions cost the kernel memory and io-thread time that no bound
    of libzmq 4.3.5 stops (docs/robustness.md, "IOPub subscriptions").

    Args:
        conn: the kernel's connection (``ip``, ``transport``, keys).
        logger: the start-up's logger (``trikernel.cli``, ``trikernel.gateway``).

    Runs on: the main thread, at start-up.
    """
    if conn.transport != "tcp" or conn.curve:
        return
    level = logging.INFO if is_loopback(conn.ip) else logging.WARNING
    logger.log(
        level,
        "CurveZMQ keys absent: kernel traffic on %s is signed, not encrypted, and whoever reaches the IOPub "
        "port reads every output and may subscribe without a key (a flood of subscriptions costs the kernel "
        "memory and io-thread time; docs/robustness.md)",
        conn.ip,
    )


def warn_if_others_can_read(path: str, what: str, holds_key: bool, logger: logging.Logger) -> None:
    """One warning line when the file at ``path`` holds a key (HMAC or CurveZMQ
    secret) and its mode lets its group or others read it (``mode & 0o044``):
    whoever can read the key can sign requests, that is run code as the user.

    Args:
        path: the connection or registration file given with ``-f``.
        what: ``"connection file"`` or ``"registration file"``, for the line.
        holds_key: the file has a non-empty ``key`` or a ``curve_secretkey``.
        logger: the start-up's logger.

    Runs on: the main thread, at start-up, before anything is bound. A file
    that cannot be stat'ed (gone meanwhile) is left alone.
    """
    if not holds_key:
        return
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:
        return
    if mode & 0o044:
        logger.warning(
            "%s %s holds the key and others can read it (mode %04o): whoever reads it can run code in this "
            "kernel; make it 0600 (chmod 600)",
            what,
            path,
            mode,
        )
