"""IPython's configuration as ipykernel applies it: trikernel's ``IPKernelApp``.

Stage 2 of IPython's command line (stage 1: user/ipyoptions.py, before
bind). :func:`create` builds a traitlets ``Application`` of IPython's
(``BaseIPythonApplication`` and ``InteractiveShellApp``, the bases of
ipykernel's ``IPKernelApp``) and initializes it as ipykernel does: the
arguments trikernel's parser left are parsed with the real classes, the
profile directory is found (``--profile``, ``--profile-dir``,
``--ipython-dir``; ``profile_default`` is created if missing), the profile's
``ipython_config.py`` then ``ipython_kernel_config.py`` (and ``--config``'s
file) load, and the command line wins. The shell is then created with the
app as its traitlets parent (user/interpreter.py ``set_up``), so
``c.InteractiveShell.*``, ``c.HistoryManager.*``, ``c.InlineBackend.*``,
``c.ZMQInteractiveShell.*`` reach it. :meth:`IPKernelApp.start_shell` runs
InteractiveShellApp's start-up on it in ipykernel's order: ``init_pdb``,
``init_path``, ``init_gui_pylab``, ``init_extensions``, ``init_code``
(startup files, ``exec_lines``, ``exec_files``, ``code_to_run``,
``module_to_run``).

The class is named ``IPKernelApp`` on purpose: traitlets applies config
sections by class name along the MRO, so ``c.IPKernelApp.exec_lines`` in a
profile reaches it, and ``'IPKernelApp' in get_ipython().config`` holds, as
libraries that look for a notebook kernel expect (polars, transformers,
wandb). It is also the facade's ``ipykernel.kernelapp.IPKernelApp``
(user/ipykernel_facade).

Runs on: the main thread, inside the user run (``set_up``), where IPython is
imported anyway; never before the sockets are bound.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from typing import TYPE_CHECKING, Any

from IPython.core.application import BaseIPythonApplication, base_aliases, base_flags
from IPython.core.profiledir import ProfileDir
from IPython.core.shellapp import InteractiveShellApp, shell_aliases, shell_flags
from traitlets import Dict, Unicode
from traitlets.config.loader import ArgumentError
from traitlets.traitlets import TraitError

from trikernel.errors import ConfigError
from trikernel.user import ipyoptions

if TYPE_CHECKING:
    from collections.abc import Sequence

    from trikernel.user.shell import TrikernelShell

log = logging.getLogger("trikernel.ipython")


def _aliases() -> dict[str, Any]:
    """ipykernel's ``kernel_aliases``, built as ipykernel builds them from the
    installed IPython (jupyter_client's session ones as data: stage 1 refuses
    them anyway)."""
    return {**base_aliases, **ipyoptions.IPYKERNEL_ALIASES, **shell_aliases, **ipyoptions.SESSION_ALIASES}


def _flags() -> dict[str, Any]:
    """ipykernel's ``kernel_flags``, from the installed IPython (see :func:`_aliases`)."""
    return {**base_flags, **ipyoptions.IPYKERNEL_FLAGS, **shell_flags, **ipyoptions.SESSION_FLAGS}


class IPKernelApp(BaseIPythonApplication, InteractiveShellApp):
    """IPython's application under ipykernel's name (module docstring).

    ``name`` gives the kernel's config file, ``ipython_kernel_config.py``
    (loaded after ``ipython_config.py``). ``connection_file`` is the file
    given with ``-f`` (wandb and ``ipykernel.get_connection_file()`` read
    it). Main thread.
    """

    name = "ipython-kernel"
    description = "trikernel: a Jupyter kernel for Python on trio"
    aliases = Dict(_aliases())
    flags = Dict(_flags())
    connection_file = Unicode("", help="the connection file (trikernel's -f)").tag(config=True)

    def _log_default(self) -> logging.Logger:
        return log

    def _configure_logging(self) -> None:
        """traitlets configures a stderr handler of its own here; the kernel's
        log is configured once, by trikernel (launch/options.py)."""

    def init_crash_handler(self) -> None:
        """IPython sets ``sys.excepthook`` to its crash handler here; a kernel's
        uncaught errors are shown in the cell instead."""

    def _create_loader(self, argv: list[str] | None, aliases: Any, flags: Any, classes: Any) -> ipyoptions.StrictLoader:
        return ipyoptions.make_loader(argv or [], aliases, flags, classes, log)

    def exit(self, exit_status: int | str | None = 0) -> None:
        """IPython stops here when a profile cannot be found or made (it has
        logged why): start-up stops with that reason, never ``sys.exit``
        inside the user run.

        Raises:
            ConfigError: always.
        """
        raise ConfigError(f"IPython's start-up failed (exit status {exit_status}); its reason is logged above")

    @classmethod
    def launch_instance(cls, argv: Any = None, **kwargs: Any) -> None:
        """traitlets' "start this application": refused, this process already
        is a kernel (the facade's ``ipykernel.kernelapp`` leads here).

        Raises:
            RuntimeError: always.
        """
        raise RuntimeError("trikernel: this process is already a kernel; ipykernel's launcher is not started")

    @property
    def kernel(self) -> Any:
        """ipykernel's ``IPKernelApp.kernel``: ``get_ipython().kernel`` (None before the shell exists)."""
        return getattr(self.shell, "kernel", None)

    def init_shell(self) -> None:
        """InteractiveShellApp's hook to create the shell: trikernel creates it
        (``set_up``) and hands it to :meth:`start_shell`."""

    def start_shell(self, shell: TrikernelShell) -> None:
        """InteractiveShellApp's start-up on ``shell``, in ipykernel's order
        (ipykernel/kernelapp.py ``initialize``): :func:`init_pdb`,
        :func:`init_breakpointhook` (ipykernel's kernel sets it in ``init_kernel``), ``init_path``
        (``''`` before the first site-packages entry, unless ``--ignore-cwd``
        or ``python -P``), ``init_gui_pylab`` (a failure goes to the kernel's
        stderr, as in ipykernel), ``init_extensions``, ``init_code``. Output
        of start-up code has no parent (frontends do not show it); errors in
        it are logged. Main thread, in the user run, before the first request.
        """
        self.shell = shell
        shell.configurables.append(self)  # type: ignore[arg-type]  # typed by its first item, the shell
        init_pdb()
        init_breakpointhook()
        self.init_path()
        self._init_gui_pylab_to_stderr(shell)
        self.init_extensions()
        self.init_code()

    def _init_gui_pylab_to_stderr(self, shell: TrikernelShell) -> None:
        saved = shell._showtraceback

        def print_tb(etype: Any, evalue: Any, stb: Any) -> None:
            log.error("GUI event loop or pylab initialization failed:\n%s", shell.InteractiveTB.stb2text(stb))

        shell._showtraceback = print_tb  # type: ignore[method-assign]
        try:
            self.init_gui_pylab()
        finally:
            shell._showtraceback = saved  # type: ignore[method-assign]


def create(argv: Sequence[str], connection_file: str | None, shell_class: type[Any]) -> IPKernelApp:
    """The process's :class:`IPKernelApp` (``IPKernelApp.instance()``),
    initialized from ``argv`` (the IPython arguments stage 1 checked) and the
    profile's config files; ``connection_file`` (absolute, or None) goes into
    ``config.IPKernelApp.connection_file``; ``shell_class`` is listed among
    the app's classes (its container traits append on the command line,
    ``%config`` lists it). Main thread, in the user run.

    Raises:
        ConfigError: a value traitlets refuses, or a profile that cannot be
            found (one line; exit code 1, as ipykernel's "Bad config").
    """
    app = IPKernelApp.instance()
    app.classes = [shell_class, ProfileDir]
    try:
        app.initialize(list(argv))
    except (TraitError, ArgumentError) as exc:
        raise ConfigError(f"bad config: {exc}") from None
    app.connection_file = connection_file or ""
    app.config.IPKernelApp.connection_file = app.connection_file
    return app


def init_pdb() -> None:
    """ipykernel's ``IPKernelApp.init_pdb``: ``pdb.set_trace()`` and
    ``breakpoint()`` use IPython's ``InterruptiblePdb``, whose command loop
    ends the cell on an interrupt (stdlib pdb prints ``--KeyboardInterrupt--``
    and prompts again, so the interrupt button never ended the cell). Main
    thread, at start-up."""
    import pdb

    from IPython.core import debugger

    if hasattr(debugger, "InterruptiblePdb"):
        debugger.Pdb = debugger.InterruptiblePdb  # type: ignore[misc]
        pdb.Pdb = debugger.Pdb  # type: ignore[misc,assignment]
        pdb.set_trace = debugger.set_trace


def init_breakpointhook() -> None:
    """``sys.breakpointhook`` as ipykernel has it: ``breakpoint()`` stops in
    the visual debugger when a debugger client is attached, and does nothing
    otherwise (no pdb prompt, no ``StdinNotImplementedError`` under nbclient
    or papermill). Main thread, at start-up, before the profile's start-up
    code (which may set its own).

    In ipykernel, ``IPythonKernel.__init__`` (ipkernel.py) imports
    ipykernel/debugger.py, whose ``from debugpy.server import api`` imports
    ``debugpy._vendored.force_pydevd``; that runs
    ``pydevd.install_breakpointhook(debugpy_breakpointhook)``, so
    ``sys.breakpointhook`` is debugpy's from start-up on. It calls
    ``debugpy.breakpoint()`` (debugpy/server/api.py), which returns at once
    ("breakpoint() ignored - debugger not attached") unless a client is
    connected, and otherwise suspends the caller's frame. Without debugpy
    ipykernel leaves Python's hook (pdb). ``PYTHONBREAKPOINT`` is not read
    (only Python's own hook reads it), there as here.

    trikernel imports debugpy only when the debugger is first turned on
    (docs/debugger.md), so until then :func:`breakpoint_without_debugger`
    stands in: no client can be attached before that. Turning the debugger
    on imports debugpy, whose hook then replaces this one (debug/debugger.py
    keeps a hook the user set instead). Only where debugpy can be imported.
    """
    try:
        if importlib.util.find_spec("debugpy") is None:
            return
    except (ImportError, ValueError):
        return
    sys.breakpointhook = breakpoint_without_debugger


def breakpoint_without_debugger(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook`` until the debugger is first turned on: debugpy's
    does nothing while no client is attached, and none can be yet. Any thread."""
    log.debug("breakpoint() ignored: the debugger is not on")
