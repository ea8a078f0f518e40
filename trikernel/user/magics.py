"""Kernel magics: ``%trikernel``, and the kernel-specific magics of ipykernel.

Main thread: magics run inside the user trio run, in the cell that calls
them. docs/magics.md lists every kernel-specific magic and what trikernel
does with it.

- ``%trikernel``: the IOPub statistics (server/iopubqueue.py IOPubStats and the queue's
  state: messages sent, waits on full subscribers, fallback drops,
  coalescing, messages dropped at shutdown) and ``malformed_dropped``: bad
  input from peers dropped or refused since start-up (badinput.py), with
  ``malformed_by_kind`` per channel and kind, ``heap_trims`` and
  ``heap_trim_due`` (server/heap.py); ``%trikernel --return`` also
  returns them as a dict. ``%trikernel log [N]``: the last N (default 20)
  lines of the ``--message-log``, one row per message (messagelog.py).
- ``%connect_info``: this kernel's connection info and how to attach
  another client (``jupyter console --existing``), as ipykernel prints it.
- ``%edit`` (``%ed``): an ``edit_magic`` payload for the frontend, as
  ipykernel (a kernel cannot wait for a GUI editor to close).
- ``%less``, ``%more``, ``%man``: through the pager (a ``page`` payload).
- ``%clear``: runs ``clear``, as ipykernel.
- ``%autosave N``: the classic Notebook's JavaScript, as ipykernel.
- ``%subshell``: which subshell runs this cell and which there are, as
  ipykernel 7 (JEP 91; registered by subshells.py).
- ``%qtconsole``: not supported; a UsageError names the command to run.
- ``%autoawait``: IPython's switch, limited to what trikernel can honour:
  cells always run in trikernel's trio run, so ``on``/``off``/``trio``.

Runs on: the user run of the cell that calls the magic (main thread or
a subshell's thread); :func:`register` and ``register_kernel_magics`` on
the main thread at set-up.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from IPython.core import page
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from trikernel.errors import KernelLoopError
from trikernel.user import aioloop

if TYPE_CHECKING:
    from collections.abc import Callable

    from trikernel.core.interfaces import MessageLogView

#: Rows ``%trikernel log`` shows without a count.
LOG_TAIL_DEFAULT = 20


def register(shell: Any, stats: Callable[[], dict[str, Any]], message_log: MessageLogView | None = None) -> None:
    """Register ``%trikernel`` on ``shell``; ``stats()`` returns the counters
    (thread-safe reads of plain ints); ``message_log``: what ``%trikernel
    log`` shows, or None when the kernel runs without ``--message-log``."""

    def trikernel_magic(line: str = "") -> dict[str, Any] | None:
        words = line.split()
        if words[:1] == ["log"]:
            _show_log(message_log, words[1:])
            return None
        if words and words != ["--return"]:
            raise UsageError(f"%trikernel {line.strip()}: use %trikernel, %trikernel --return or %trikernel log [N]")
        values = stats()
        width = max((len(k) for k in values), default=0)
        for k, v in values.items():
            print(f"{k:>{width}}: {v}")
        return values if line.strip() == "--return" else None

    shell.register_magic_function(trikernel_magic, "line", "trikernel")


def _show_log(message_log: MessageLogView | None, args: list[str]) -> None:
    """``%trikernel log [N]``: the message log's last N lines, one row each."""
    if message_log is None:
        raise UsageError("the message log is off: start the kernel with --message-log FILE (docs/conformance.md)")
    if len(args) > 1 or (args and not args[0].isdigit()):
        raise UsageError(f"usage: %trikernel log [N] (N: lines, at most {message_log.max_tail})")
    n = min(int(args[0]) if args else LOG_TAIL_DEFAULT, message_log.max_tail)
    for row in message_log.report(n):
        print(row)


@dataclass(frozen=True)
class ConnectionFile:
    """What ``%connect_info`` shows: how clients reach this kernel.

    ``info``: the connection-file JSON (``config.ConnectionInfo.to_dict()``:
    ip, transport, the five ports as bound, key, signature_scheme,
    kernel_name, curve keys if any). ``path``: an absolute path of a file
    holding it (the ``-f`` connection file, or ``--write-connection-file``),
    or None when there is none (started from a JEP 66 registration file
    without ``--write-connection-file``).
    """

    info: dict[str, Any]
    path: str | None = None


_ATTACH = """\
Paste the above JSON into a file, and connect with:
    $> jupyter <app> --existing <file>
or, if you are local, you can connect with just:
    $> jupyter <app> --existing {name}
or even just:
    $> jupyter <app> --existing
if this is the most recent Jupyter kernel you have started."""

_ATTACH_NO_FILE = """\
Paste the above JSON into a file, and connect with:
    $> jupyter <app> --existing <file>
(this kernel was started from a registration file, JEP 66, and has no
connection file of its own; start it with --write-connection-file PATH to get one)"""


@magics_class
class KernelMagics(Magics):
    """ipykernel's KernelMagics (ipykernel/zmqshell.py) for trikernel."""

    shell: Any

    def __init__(self, shell: Any, connection: ConnectionFile | None):
        super().__init__(shell)
        self.connection = connection

    @line_magic
    def connect_info(self, arg_s: str = "") -> None:
        """Print the information for connecting other clients to this kernel.

        The connection info (JSON) and how to attach a client to it with
        ``jupyter <app> --existing``; the file's name alone is enough when
        it lives in Jupyter's runtime directory.
        """
        c = self.connection
        if c is None:
            raise UsageError("connection info is not known to this shell")
        print(json.dumps(c.info, indent=2) + "\n")
        if c.path is None:
            print(_ATTACH_NO_FILE)
            return
        from jupyter_core.paths import jupyter_runtime_dir

        name = c.path
        if os.path.realpath(jupyter_runtime_dir()) == os.path.realpath(os.path.dirname(c.path)):
            name = os.path.basename(c.path)
        print(_ATTACH.format(name=name))

    @line_magic
    def qtconsole(self, arg_s: str = "") -> None:
        """Not supported by trikernel: start a console yourself (see %connect_info)."""
        raise UsageError(
            "%qtconsole is not supported by trikernel; run `jupyter qtconsole --existing <file>` "
            "with the connection file that %connect_info names"
        )

    @line_magic
    def edit(self, parameter_s: str = "", last_call: list[str] | None = None) -> None:
        """Ask the frontend to open a file in its editor (an ``edit_magic`` payload).

        Arguments as IPython's ``%edit`` (options ``-p``, ``-r``, ``-n N``).
        Unlike in a terminal, the file is not run when the editor closes.
        """
        from IPython.core.magics.code import CodeMagics, MacroToEdit

        last_call = last_call or ["", ""]
        opts, args = self.parse_options(parameter_s, "prn:")
        try:
            filename, lineno, _ = CodeMagics._find_edit_target(self.shell, args, opts, last_call)
        except MacroToEdit:
            print("Macro editing is not implemented in a kernel.")
            return
        payload = {"source": "edit_magic", "filename": str(Path(filename).resolve()), "line_number": lineno}
        self.shell.payload_manager.write_payload(payload)

    @line_magic
    def clear(self, arg_s: str = "") -> None:
        """Clear the terminal (runs ``clear``, as ipykernel)."""
        self.shell.system("clear" if os.name == "posix" else "cls")

    @line_magic
    def less(self, arg_s: str = "") -> None:
        """Show a file through the pager; ``.py`` files are syntax-highlighted."""
        _page_file(self.shell, arg_s)

    @line_magic
    def more(self, arg_s: str = "") -> None:
        """Show a file through the pager (as %less)."""
        _page_file(self.shell, arg_s)

    @line_magic
    def man(self, arg_s: str = "") -> None:
        """Show a command's man page through the pager."""
        page.page(self.shell.getoutput(f"man {arg_s} | col -b", split=False))

    @line_magic
    def autosave(self, arg_s: str = "") -> None:
        """Set the classic Notebook's autosave interval in seconds (0 disables it).

        Only the classic Notebook runs this (it is JavaScript); JupyterLab
        has its own setting.
        """
        from IPython.display import Javascript, display

        try:
            interval = int(arg_s)
        except ValueError as exc:
            raise UsageError(f"%autosave requires an integer, got {arg_s!r}") from exc
        display(
            Javascript(f"IPython.notebook.set_autosave_interval({1000 * interval})"), include=["application/javascript"]
        )
        print(f"Autosaving every {interval} seconds" if interval else "Autosave disabled")

    @line_magic
    def autoawait(self, parameter_s: str = "") -> None:
        """Show or switch top-level ``await``: ``%autoawait [on|off|asyncio|trio]``.

        ``asyncio`` (and ``on``, the default unless ``--autoawait trio``): a
        cell may await asyncio and trio alike, on the kernel's asyncio loop
        inside its trio run; ``trio``: pure trio, no asyncio adapter on the
        cells' path; ``off``: no top-level ``await``. curio or a runner of
        yours cannot be chosen (a UsageError says so, instead of a switch
        that does nothing). User runs; applies to every shell lane.
        """
        param = parameter_s.strip().lower()
        if not param:
            print(
                f"IPython autoawait is `{'on' if self.shell.autoawait else 'off'}`, and set to use "
                f"`{aioloop.mode()}`: {_AUTOAWAIT_MODES[aioloop.mode()]}"
            )
            return
        if param in ("false", "off"):
            self.shell.autoawait = False
            return
        if param in ("true", "on", "asyncio", "trio"):
            try:
                aioloop.set_mode("trio" if param == "trio" else "asyncio")
            except KernelLoopError as exc:
                raise UsageError(f"%autoawait {param}: {exc}") from None
            self.shell.autoawait = True
            return
        raise UsageError(
            f"%autoawait {parameter_s.strip()}: trikernel runs every cell in its trio run, beside its asyncio "
            "loop, so only on, off, asyncio and trio are available"
        )


#: what %autoawait says of each mode
_AUTOAWAIT_MODES = {
    "asyncio": "cells may await asyncio and trio alike",
    "trio": "cells run as pure trio (no running asyncio loop in a cell, asyncio futures cannot be awaited)",
}


def _page_file(shell: Any, path: str) -> None:
    from IPython.utils import openpy

    if not path:
        raise UsageError("Missing filename.")
    if path.endswith(".py"):
        text = shell.pycolorize(openpy.read_py_file(path, skip_encoding_cookie=False))
    else:
        with open(path) as f:
            text = f.read()
    page.page(text)


def register_kernel_magics(shell: Any, connection: ConnectionFile | None) -> None:
    """Register :class:`KernelMagics` on ``shell`` (after IPython's, so ``%edit``
    and ``%autoawait`` replace IPython's). ``connection``: what ``%connect_info``
    prints."""
    shell.register_magics(KernelMagics(shell, connection))
    shell.magics_manager.register_alias("ed", "edit")
