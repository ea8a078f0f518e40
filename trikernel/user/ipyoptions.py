"""IPython's command line as ipykernel takes it: its aliases and flags, and a
strict traitlets loader.

A kernelspec or launcher may add IPython options to the kernel's command
line, as it would for ipykernel: nbclient (and so ``jupyter execute``,
nbconvert ``--execute``, papermill, testbook) adds
``--HistoryManager.hist_file=:memory:`` for any kernel named ``python3``;
kernelspecs carry ``--InteractiveShell.ast_node_interactivity=all``,
``--profile-dir DIR``, ``--matplotlib=inline``, ``-c CODE``. They are read in
two stages (docs/design.md, "IPython's command line and configuration"):

1. before bind (launch/cli.py): trikernel's own options are taken by its
   parser; what is left goes through :func:`check` — traitlets'
   ``KVArgParseConfigLoader`` with ipykernel's aliases and flags, held here as
   data (:data:`ALIASES`, :data:`FLAGS`) so that IPython is not imported
   before the sockets are bound. An option that is neither trikernel's nor
   IPython's stops start-up with one line naming it
   (:class:`~trikernel.errors.ConfigError`), where traitlets itself would
   only warn;
2. in the user run (user/kernelapp.py): the same arguments are parsed again
   by trikernel's ``IPKernelApp``, with the real classes (container traits
   append), then the profile's config files load and the CLI wins, as in
   ipykernel.

Nothing here parses an option itself: traitlets' loader does, made strict
through its own hooks (``_handle_unrecognized_alias``, ``parser_class``).

Runs on: the main thread — before bind (stage 1, launch/cli.py) and inside
the user run (stage 2, user/kernelapp.py). Imports traitlets, not IPython.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any, NoReturn

from traitlets.config.loader import ArgumentError, KVArgParseConfigLoader, _KVArgParser

from trikernel.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from traitlets.config import Config

#: ipykernel's own aliases (ipykernel/kernelapp.py ``kernel_aliases``), on top of IPython's.
IPYKERNEL_ALIASES: dict[str, str] = {
    "ip": "IPKernelApp.ip",
    "hb": "IPKernelApp.hb_port",
    "shell": "IPKernelApp.shell_port",
    "iopub": "IPKernelApp.iopub_port",
    "stdin": "IPKernelApp.stdin_port",
    "control": "IPKernelApp.control_port",
    "f": "IPKernelApp.connection_file",
    "transport": "IPKernelApp.transport",
}

#: ipykernel's own flags (``kernel_flags``). ``--trio-loop`` asks ipykernel to
#: run cells on trio, which trikernel always does: accepted, it sets nothing.
IPYKERNEL_FLAGS: dict[str, tuple[dict[str, Any], str]] = {
    "no-stdout": ({"IPKernelApp": {"no_stdout": True}}, "redirect stdout to the null device"),
    "no-stderr": ({"IPKernelApp": {"no_stderr": True}}, "redirect stderr to the null device"),
    "pylab": ({"IPKernelApp": {"pylab": "auto"}}, "Pre-load matplotlib and numpy for interactive use"),
    "trio-loop": ({}, "accepted: trikernel always runs cells on trio"),
}

#: IPython's ``base_aliases`` and ``shell_aliases`` (IPython 9), as data: stage 1 runs before IPython may
#: be imported. tests/test_ipython_config.py checks them against the
#: installed IPython; stage 2 takes the installed IPython's own tables.
IPYTHON_ALIASES: dict[str, str] = {
    "log-level": "Application.log_level",
    "profile-dir": "ProfileDir.location",
    "profile": "BaseIPythonApplication.profile",
    "ipython-dir": "BaseIPythonApplication.ipython_dir",
    "config": "BaseIPythonApplication.extra_config_file",
    "autocall": "InteractiveShell.autocall",
    "colors": "InteractiveShell.colors",
    "theme": "InteractiveShell.colors",
    "logfile": "InteractiveShell.logfile",
    "logappend": "InteractiveShell.logappend",
    "c": "InteractiveShellApp.code_to_run",
    "m": "InteractiveShellApp.module_to_run",
    "ext": "InteractiveShellApp.extra_extensions",
    "gui": "InteractiveShellApp.gui",
    "pylab": "InteractiveShellApp.pylab",
    "matplotlib": "InteractiveShellApp.matplotlib",
    "cache-size": "InteractiveShell.cache_size",
}

#: jupyter_client's ``session_aliases`` and ``session_flags`` (refused: the
#: session comes from the connection file; importing jupyter_client for them
#: would cost ~0.1 s of the first cell).
SESSION_ALIASES: dict[str, str] = {"ident": "Session.session", "user": "Session.username", "keyfile": "Session.keyfile"}


def _flag(section: str, **traits: Any) -> tuple[dict[str, Any], str]:
    return {section: traits}, ""


def _toggle(name: str, section: str, trait: str | None = None) -> dict[str, tuple[dict[str, Any], str]]:
    """IPython's pair of flags ``--NAME`` / ``--no-NAME`` for one boolean trait."""
    trait = trait or name.replace("-", "_")
    return {name: _flag(section, **{trait: True}), f"no-{name}": _flag(section, **{trait: False})}


#: IPython's ``base_flags`` and ``shell_flags``, as data (see :data:`IPYTHON_ALIASES`).
IPYTHON_FLAGS: dict[str, tuple[dict[str, Any], str]] = {
    "debug": _flag("Application", log_level=10),
    "show-config": _flag("Application", show_config=True),
    "show-config-json": _flag("Application", show_config_json=True),
    "quiet": _flag("Application", log_level=50),
    "init": _flag("BaseIPythonApplication", copy_config_files=True, auto_create=True),
    **_toggle("autoindent", "InteractiveShell"),
    **_toggle("automagic", "InteractiveShell"),
    **_toggle("pdb", "InteractiveShell"),
    **_toggle("pprint", "PlainTextFormatter"),
    **_toggle("color-info", "InteractiveShell"),
    **_toggle("ignore-cwd", "InteractiveShellApp"),
    "nosep": _flag("InteractiveShell", separate_in="", separate_out="", separate_out2=""),
    "pylab": _flag("InteractiveShellApp", pylab="auto"),
    "matplotlib": _flag("InteractiveShellApp", matplotlib="auto"),
}
SESSION_FLAGS: dict[str, tuple[dict[str, Any], str]] = {
    "secure": _flag("Session", key=b"", keyfile=""),
    "no-secure": _flag("Session", key=b"", keyfile=""),
}

#: ipykernel's aliases and flags in the order ipykernel merges them (its own,
#: then IPython's shell and session tables over them: ``--pylab`` is
#: IPython's ``InteractiveShellApp.pylab``).
ALIASES: dict[str, str] = {**IPYKERNEL_ALIASES, **IPYTHON_ALIASES, **SESSION_ALIASES}
FLAGS: dict[str, tuple[dict[str, Any], str]] = {**IPYKERNEL_FLAGS, **IPYTHON_FLAGS, **SESSION_FLAGS}

#: Settings ipykernel takes that trikernel cannot honour, each with the reason
#: start-up gives when one is on the command line. A section alone refuses
#: every trait of it.
REFUSED: dict[str, str] = {
    "IPKernelApp.ip": "the address comes from the connection file (-f)",
    "IPKernelApp.hb_port": "ports come from the connection file (-f)",
    "IPKernelApp.shell_port": "ports come from the connection file (-f)",
    "IPKernelApp.iopub_port": "ports come from the connection file (-f)",
    "IPKernelApp.stdin_port": "ports come from the connection file (-f)",
    "IPKernelApp.control_port": "ports come from the connection file (-f)",
    "IPKernelApp.transport": "the transport comes from the connection file (-f)",
    "IPKernelApp.connection_file": "give the connection file with -f",
    "IPKernelApp.kernel_class": "trikernel's kernel class cannot be replaced",
    "IPKernelApp.no_stdout": "not offered: sys.stdout always goes to the notebook",
    "IPKernelApp.no_stderr": "not offered: sys.stderr always goes to the notebook",
    "Application.show_config": "not offered: the kernel does not stop to print its config",
    "Application.show_config_json": "not offered: the kernel does not stop to print its config",
    "Session": "the session (key, signature scheme, id) comes from the connection file (-f)",
}

_EXPECTED_ONE = re.compile(r"argument (-{1,2}[^\s:/]+)(?:/\S+)?: expected one argument")


class _OneLineParser(_KVArgParser):
    """traitlets' parser, whose errors raise :class:`ConfigError` instead of
    printing argparse's usage and exiting."""

    def error(self, message: str) -> NoReturn:
        """argparse's error hook: raise ConfigError with one line naming the option."""
        m = _EXPECTED_ONE.match(message)
        if m and "." not in m.group(1) and m.group(1).lstrip("-") not in ALIASES:
            raise ConfigError(f"unrecognized option {m.group(1)}")
        raise ConfigError(message)


class StrictLoader(KVArgParseConfigLoader):
    """traitlets' ``KVArgParseConfigLoader``, strict where traitlets only warns:
    an unknown alias (``--bogus=1``) raises :class:`ConfigError`, through the
    hook traitlets provides for that (``_handle_unrecognized_alias``). Main
    thread."""

    parser_class = _OneLineParser

    def _handle_unrecognized_alias(self, arg: str) -> None:
        raise ConfigError(f"unrecognized option --{arg}")


def make_loader(
    argv: Sequence[str],
    aliases: dict[str, Any],
    flags: dict[str, Any],
    classes: list[type[Any]] | None = None,
    log: logging.Logger | None = None,
) -> StrictLoader:
    """A :class:`StrictLoader` of ``argv`` with these aliases, flags and
    ``classes`` (their container traits append when given twice). Main thread."""
    return StrictLoader(
        list(argv), aliases, flags, classes=classes or [], log=log or logging.getLogger("trikernel.config")
    )


def check(argv: Sequence[str]) -> Config:
    """Stage 1: the traitlets config of ``argv`` (what trikernel's own parser
    left), read with ipykernel's aliases and flags. ``--Class.trait=value``
    for any class is accepted, as by ipykernel; values are checked only in
    stage 2, when the classes exist. Main thread, before bind.

    Returns:
        The config (``config.Application.log_level`` holds ``--debug`` and
        the like).

    Raises:
        ConfigError: one line naming the option — unknown (``--bogus``,
            ``--bogus=1``), a stray argument, a malformed value, or one of
            :data:`REFUSED` with its reason.
    """
    loader = make_loader(argv, ALIASES, FLAGS)
    try:
        config = loader.load_config()
    except ArgumentError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    if loader.extra_args:
        raise ConfigError(f"unrecognized argument {loader.extra_args[0]!r}")
    refuse(config)
    return config


def refuse(config: Config) -> None:
    """Raise ConfigError for the first setting of ``config`` in :data:`REFUSED`
    (naming the option and the reason). Main thread."""
    for dotted, why in REFUSED.items():
        section, _, trait = dotted.partition(".")
        if section in config and (not trait or trait in config[section]):
            option = _option_for(dotted) if trait else f"--{section}.*"
            raise ConfigError(f"{option}: {why}")


def _option_for(dotted: str) -> str:
    names = [k for k, v in ALIASES.items() if v == dotted]
    return f"--{names[0]} ({dotted})" if names else f"--{dotted}"


def log_level_of(config: Config) -> int | None:
    """The ``logging`` level ``--debug``, ``--quiet`` or
    ``--Application.log_level=...`` asked for; None when none did. Any thread.

    Raises:
        ConfigError: the value is neither a number nor a level name.
    """
    if "Application" not in config or "log_level" not in config.Application:
        return None
    value = config.Application.log_level
    try:
        return int(value)
    except (TypeError, ValueError):
        level = logging.getLevelName(str(value).upper())
        if not isinstance(level, int):
            raise ConfigError(f"--Application.log_level: {value!r} is not a log level") from None
        return level
