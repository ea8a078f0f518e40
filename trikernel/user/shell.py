"""IPython integration: execute, complete, inspect, is_complete, history.

Runs only on the main thread, inside the user trio run (userrun.py; job bodies in user/interpreter.py).
Display goes out as IOPub display_data / update_display_data /
clear_output / execute_result / error (messaging spec "IOPub"); ``?`` and
``%page`` become ``page`` payloads; ``exit`` becomes an ``ask_exit``
payload. Cells are run with ``run_cell_async`` awaited in the user trio run,
so top-level ``await`` of trio code works with no magic.
"""

from __future__ import annotations

import base64
import logging
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

import trio
from IPython.core import page, payloadpage
from IPython.core.autocall import ZMQExitAutocall
from IPython.core.compilerop import CachingCompiler
from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.error import StdinNotImplementedError, UsageError
from IPython.core.interactiveshell import ExecutionResult, InteractiveShell, InteractiveShellABC
from IPython.core.payload import PayloadManager
from IPython.utils.tokenutil import token_at_cursor
from traitlets import Any as TAny
from traitlets import Instance, Type

from trikernel.errors import GuiError
from trikernel.user import aioloop, awaitmagics, cellnames, guiloop, lanestate, tracebacks
from trikernel.user.history import HistoryManager

if TYPE_CHECKING:
    from collections.abc import Callable

    from trikernel.user.kernelhandle import KernelHandle
    from trikernel.user.outstream import Publisher

log = logging.getLogger("trikernel.shell")


def clean_bundle(data: dict[str, Any]) -> dict[str, Any]:
    """Mime bundle with bytes values base64-encoded (images) for JSON."""
    out = {}
    for k, v in data.items():
        if isinstance(v, (bytes, bytearray, memoryview)):
            v = base64.b64encode(bytes(v)).decode("ascii")
        out[k] = v
    return out


def send_display(publisher: Publisher, msg_type: str, content: dict[str, Any]) -> None:
    """Publish display output; data JSON cannot carry is the caller's error.

    Raises:
        TypeError: ``content`` holds something JSON cannot carry (raised
            in the user's code, without the serialiser's internals); nothing
            was queued.
    """
    try:
        publisher.send(msg_type, content)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{msg_type} cannot be sent: its data or metadata is not JSON-serialisable ({exc})") from None


class TrikernelDisplayPublisher(DisplayPublisher):
    """IPython's ``DisplayPublisher`` for ``display()``: publishes IOPub ``display_data`` and
    ``update_display_data`` through trikernel's :class:`~.outstream.Publisher` (``publisher``,
    set by :func:`create_shell`) instead of printing ``text/plain``."""

    publisher = TAny()

    def publish(
        self,
        data: dict[str, Any],
        metadata: dict[str, Any] | None = None,
        source: Any = None,
        *,
        transient: dict[str, Any] | None = None,
        update: bool = False,
        **kwargs: Any,
    ) -> None:
        """``IPython.core.displaypub.DisplayPublisher.publish``: instead of printing text/plain,
        publishes the whole mime bundle (bytes values base64-encoded), ``metadata`` and
        ``transient`` as IOPub ``display_data``, or ``update_display_data`` with ``update``
        (messaging spec "Display Data", "Update Display Data"), parented to the running
        request. Raises TypeError when the data cannot be JSON-encoded (nothing is queued)."""
        content = {"data": clean_bundle(data), "metadata": metadata or {}, "transient": transient or {}}
        send_display(self.publisher, "update_display_data" if update else "display_data", content)

    def clear_output(self, wait: bool = False) -> None:
        """``IPython.core.displaypub.DisplayPublisher.clear_output``: publishes IOPub
        ``clear_output`` with ``wait`` (messaging spec "Clear output") instead of writing
        terminal erase sequences to stdout and stderr."""
        self.publisher.send("clear_output", {"wait": bool(wait)})


class TrikernelDisplayHook(DisplayHook):
    """execute_result for the last expression of a cell.

    ``formatting`` is true while the result is being formatted: an error
    shown then (a ``__repr__`` or ``_repr_*_`` that raises) fails the
    execute request, as in ipykernel 7.
    """

    publisher = TAny()
    formatting = False

    def start_displayhook(self) -> None:
        """``IPython.core.displayhook.DisplayHook.start_displayhook``: sets ``formatting`` (an
        error shown from here on fails the request) and starts an empty ``execute_result``
        content."""
        self.formatting = True
        self._content: dict[str, Any] = {"data": {}, "metadata": {}}

    def write_output_prompt(self) -> None:
        """``IPython.core.displayhook.DisplayHook.write_output_prompt``: puts ``prompt_count``
        into the result's ``execution_count`` (the running cell's number) instead of writing
        ``Out[n]:`` to stdout."""
        self._content["execution_count"] = self.prompt_count

    def write_format_data(self, format_dict: dict[str, Any], md_dict: dict[str, Any] | None = None) -> None:
        """``IPython.core.displayhook.DisplayHook.write_format_data``: keeps the whole format
        dict (bytes values base64-encoded) and ``md_dict`` as the result's ``data`` and
        ``metadata`` instead of printing ``text/plain``."""
        self._content["data"] = clean_bundle(format_dict)
        self._content["metadata"] = md_dict or {}

    def finish_displayhook(self) -> None:
        """``IPython.core.displayhook.DisplayHook.finish_displayhook``: clears ``formatting`` and
        publishes the collected IOPub ``execute_result`` (messaging spec "Execution results")
        if it has data, instead of flushing stdout. Raises TypeError when the data cannot be
        JSON-encoded."""
        self.formatting = False
        content, self._content = self._content, {}
        if content.get("data"):
            send_display(self.publisher, "execute_result", content)


class CellCompiler(CachingCompiler):
    """IPython's compiler naming each cell as ipykernel's ``XCachingCompiler``
    does: ``cellnames.cell_path(raw code)``, the file JupyterLab's debugger
    maps the cell to (and shows as ``Cell [n]``). IPython's tracebacks still
    say ``Cell In[n]`` (it maps the name back to the cell number)."""

    def get_code_name(self, raw_code: str, transformed_code: str, number: int) -> str:
        """``IPython.core.compilerop.CachingCompiler.get_code_name``: the cell's file name is
        ``cellnames.cell_path(raw_code)`` (``$IPYKERNEL_CELL_NAME``, else murmur2 of the raw
        code under ``<tmp>/ipykernel_<pid>/``), as under ipykernel, from the first cell on."""
        return cellnames.cell_path(raw_code)


class TrikernelShell(InteractiveShell):
    """An InteractiveShell that publishes through trikernel."""

    compiler_class = Type(CellCompiler)
    displayhook_class = Type(TrikernelDisplayHook)
    display_pub_class = Type(TrikernelDisplayPublisher)
    # what IPython's init_displayhook / init_display_pub make of the classes above
    displayhook: TrikernelDisplayHook
    display_pub: TrikernelDisplayPublisher
    exiter = Instance(ZMQExitAutocall)
    publisher = TAny()
    # per shell lane (main shell, subshells): cells on two lanes run at once (lanestate.py)
    execution_count = lanestate.ExecutionCount()
    payload_manager = lanestate.PerLane(lambda shell: PayloadManager(parent=shell))
    _last_traceback = lanestate.PerLane(lambda shell: [])

    def _exiter_default(self) -> ZMQExitAutocall:
        return ZMQExitAutocall(self)

    def init_environment(self) -> None:
        """``IPython.core.interactiveshell.InteractiveShell.init_environment`` (a no-op there):
        sets, as ipykernel does, ``TERM=xterm-color``, ``CLICOLOR=1``, ``PAGER`` and
        ``GIT_PAGER`` to ``cat`` (no pager can wait for a keyboard here), and ``MPLBACKEND``
        to matplotlib-inline's backend unless it is set. Process environment; main thread, at
        start-up."""
        env = os.environ
        env["TERM"] = "xterm-color"
        env["CLICOLOR"] = "1"
        env["PAGER"] = "cat"
        env["GIT_PAGER"] = "cat"
        env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")

    def init_history(self) -> None:
        """IPython's history, written by trikernel.history.HistoryManager:
        ``run_cell`` never waits for the saving thread's SQLite commit (a
        history_request's ``get_tail`` still waits for a write in flight)."""
        self.history_manager = HistoryManager(shell=self, parent=self)
        self.configurables.append(self.history_manager)  # type: ignore[arg-type]  # typed by its first item, the shell

    def init_hooks(self) -> None:
        """``IPython.core.interactiveshell.InteractiveShell.init_hooks``, plus a
        ``show_in_pager`` hook (priority 99, ahead of IPython's default) that turns ``?``,
        ``%page`` and the pager into a ``page`` payload of the reply
        (``IPython.core.payloadpage``) instead of a terminal pager."""
        super().init_hooks()
        self.set_hook("show_in_pager", page.as_hook(payloadpage.page), 99)

    def ask_exit(self) -> None:
        """What ``exit`` / ``quit`` call (IPython's ``ZMQExitAutocall``, as ipykernel's
        ``ZMQInteractiveShell.ask_exit``): writes an ``ask_exit`` payload (``keepkernel``:
        :attr:`keepkernel_on_exit`, which ``exit(keep_kernel=True)`` sets) into the reply
        (messaging spec "Payloads"), and ``exit_now`` unless the kernel is kept. Without
        ``keepkernel`` the kernel shuts down after the cell's reply and idle, through the
        normal shutdown (core/requests.py ``execute``), as ipykernel stops then."""
        keep = bool(self.keepkernel_on_exit)
        self.exit_now = not keep
        self._payloads().write_payload({"source": "ask_exit", "keepkernel": keep})

    keepkernel_on_exit = False
    #: the ``error`` content of a failure to format this cell's result (see
    #: TrikernelDisplayHook); per shell lane (lanestate.py)
    _formatting_error = lanestate.PerLane(lambda shell: None)
    #: what ``get_ipython().kernel`` offers user code (user/kernelhandle.py)
    kernel: KernelHandle | None = None

    def _payloads(self) -> Any:
        pm = self.payload_manager
        assert pm is not None, "IPython shell without a payload manager"
        return pm

    async def run_ast_nodes(
        self,
        nodelist: list[Any],
        cell_name: str,
        interactivity: str = "last_expr",
        compiler: Any = compile,
        result: ExecutionResult | None = None,
    ) -> Any:
        """``IPython.core.interactiveshell.InteractiveShell.run_ast_nodes``; a cell that
        awaits runs inside the kernel's asyncio loop, so it may await asyncio and trio alike,
        and one that does not runs with no running loop, as in plain Python (user/aioloop.py
        ``driver_for``, ``run_cell``). The user run's task that runs the cell."""
        loop = aioloop.driver_for(nodelist, cell_name, autoawait=bool(self.autoawait))
        cell = super().run_ast_nodes(nodelist, cell_name, interactivity=interactivity, compiler=compiler, result=result)
        return await (cell if loop is None else aioloop.run_cell(cell, loop))

    async def run_line_magic_async(self, magic_name: str, line: str) -> Any:
        """``run_line_magic`` for ``%time``/``%timeit`` whose statement awaits
        (the cell's AST is rewritten to await this; awaitmagics.py)."""
        return await awaitmagics.run_magic_async(self, "line", magic_name, line, None)

    async def run_cell_magic_async(self, magic_name: str, line: str, cell: str) -> Any:
        """``run_cell_magic`` for ``%%time``/``%%timeit``/``%%capture`` whose code awaits (awaitmagics.py)."""
        return await awaitmagics.run_magic_async(self, "cell", magic_name, line, cell)

    def set_next_input(self, text: str, replace: bool = False) -> None:
        """``IPython.core.interactiveshell.InteractiveShell.set_next_input``: instead of the
        readline buffer, writes a ``set_next_input`` payload (``text``, ``replace``) into the
        running cell's reply: the frontend puts ``text`` into a new cell below, or with
        ``replace`` in place of this cell's text (messaging spec "Payloads")."""
        self._payloads().write_payload({"source": "set_next_input", "text": text, "replace": replace})

    def init_magics(self) -> None:
        """``IPython.core.interactiveshell.InteractiveShell.init_magics``, then replaces
        IPython's ``%gui`` with trikernel's (guiloop.py), which moves the user run onto a GUI
        loop and shows its errors in the cell instead of the kernel's log."""
        super().init_magics()
        guiloop.register_magic(self)  # %gui that shows its errors in the cell

    def enable_gui(self, gui: str | None = None) -> None:
        """Let GUI ``gui``'s event loop host the user trio run (``%gui``,
        ``%matplotlib``); None: the plain run (guiloop.py).

        Raises:
            UsageError: the toolkit cannot host the run (the message says
                why); nothing changed.
        """
        try:
            self.active_eventloop = guiloop.enable_gui(gui)
        except GuiError as exc:
            raise UsageError(str(exc)) from None

    def enable_matplotlib(self, gui: str | None = None) -> Any:
        """IPython's, refusing a GUI toolkit trikernel does not integrate
        (or one that cannot start here) before matplotlib switches to its
        backend."""
        if gui not in (None, "auto"):
            from IPython.core import pylabtools

            try:
                resolved, _backend = pylabtools.find_gui_and_backend(gui, self.pylab_gui_select)
            except Exception:
                resolved = None  # IPython reports the bad name itself below
            try:
                guiloop.check_supported(resolved)
                if resolved in guiloop.HOSTED:
                    guiloop.prepare_host(resolved)  # Qt: the QApplication matplotlib then finds
            except GuiError as exc:
                raise UsageError(str(exc)) from None
        return super().enable_matplotlib(gui)

    def init_traceback_handlers(self, custom_exceptions: Any) -> None:
        """``IPython.core.interactiveshell.InteractiveShell.init_traceback_handlers``, then
        replaces ``InteractiveTB`` with :class:`~.tracebacks.TrikernelTB` (same mode and
        colours, offset 1): machinery frames hidden, exception text that cannot fail."""
        super().init_traceback_handlers(custom_exceptions)
        # as IPython's, with machinery frames hidden and text that cannot fail (tracebacks.py)
        self.InteractiveTB = tracebacks.TrikernelTB(mode=self.xmode, theme_name=self.colors, tb_offset=1)

    def showtraceback(
        self,
        exc_tuple: Any = None,
        filename: str | None = None,
        tb_offset: int | None = None,
        exception_only: bool = False,
        running_compiled_code: bool = False,
    ) -> None:
        """Publish the exception as one IOPub ``error`` (spec "Execution errors").

        As IPython's, except: exception groups (trio nurseries) are an
        ``error`` too (IPython prints them to stderr), a failure to format
        never replaces the exception or escapes, and machinery frames are
        hidden (tracebacks.py).
        """
        try:
            etype, value, tb = self._get_exc_info(exc_tuple)
        except ValueError:
            print("No traceback available to show.", file=sys.stderr)
            return
        try:
            if issubclass(etype, SyntaxError):
                self.showsyntaxerror(filename, running_compiled_code)
                return
            if etype is UsageError:
                self.show_usage_error(value)
                return
            stb = tracebacks.structured(
                self.InteractiveTB, etype, value, tb, tb_offset=tb_offset, exception_only=exception_only
            )
            self._showtraceback(etype, value, stb)
            if self.call_pdb and not exception_only:
                self.debugger(force=True)
        except KeyboardInterrupt:
            # an interrupt while formatting: say which exception it was (as IPython)
            print("\n" + tracebacks.one_line(etype, value)[0], file=sys.stderr)

    def showsyntaxerror(self, filename: str | None = None, running_compiled_code: bool = False) -> None:
        """``IPython.core.interactiveshell.InteractiveShell.showsyntaxerror``: IPython's, but if
        IPython fails to format the SyntaxError, the error is still published as one IOPub
        ``error``, with the standard library's text (tracebacks.py): a formatting failure
        never escapes."""
        etype, value, _tb = self._get_exc_info()
        try:
            super().showsyntaxerror(filename, running_compiled_code)
        except Exception:
            log.debug("IPython could not format a SyntaxError", exc_info=True)
            self._showtraceback(etype, value, tracebacks.structured(self.InteractiveTB, etype, value, None))

    def _showtraceback(self, etype: type, evalue: BaseException, stb: list[str]) -> None:
        self._last_traceback = stb
        content = {"traceback": stb, "ename": etype.__name__, "evalue": tracebacks.safe_str(evalue)}
        if getattr(self.displayhook, "formatting", False):
            self._formatting_error = content  # the cell's result could not be formatted: the request failed
        self.publisher.send("error", content)

    def _format_exception_for_storage(
        self, exception: BaseException, filename: str | None = None, running_compiled_code: bool = False
    ) -> dict[str, Any]:
        """The history's record of a cell's error; IPython's fails on a str() that raises."""
        try:
            return super()._format_exception_for_storage(exception, filename, running_compiled_code)  # type: ignore[no-any-return]
        except Exception:
            etype = type(exception)
            stb = tracebacks.structured(self.InteractiveTB, etype, exception, exception.__traceback__, tb_offset=1)
            return {"ename": etype.__name__, "evalue": tracebacks.safe_str(exception), "traceback": stb}

    def _user_obj_error(self) -> dict[str, Any]:
        """A failed user expression (execute_reply ``user_expressions``); IPython's fails on a str() that raises."""
        etype, evalue, _tb = self._get_exc_info()
        return {
            "status": "error",
            "traceback": tracebacks.exception_lines(self.InteractiveTB, etype, evalue),
            "ename": etype.__name__,
            "evalue": tracebacks.safe_str(evalue),
        }


InteractiveShellABC.register(TrikernelShell)


def create_shell(publisher: Publisher, cls: type[TrikernelShell] = TrikernelShell, **traits: Any) -> TrikernelShell:
    """Create the process's one shell (``cls.instance``, a :class:`TrikernelShell`) publishing
    through ``publisher``: display publisher and display hook wired to it, ``autoawait`` on,
    the AST rewrite of ``await`` under ``%time`` / ``%timeit`` / ``%%capture``, and IPython's
    ProvisionalCompleterWarning ignored process-wide. ``traits``: more constructor arguments
    (``parent``: the traitlets app whose config the shell takes, ``profile_dir``). Main
    thread, once, inside the user run. Raises traitlets' TraitError for a config value the
    shell's traits refuse."""
    shell = cls.instance(publisher=publisher, **traits)
    shell.displayhook.publisher = publisher
    shell.display_pub.publisher = publisher
    shell.autoawait = True
    # cells are awaited in the user run; this runner serves only nested synchronous run_cell calls
    shell.loop_runner = awaitmagics.loop_runner
    shell.ast_transformers.append(awaitmagics.AwaitInMagics(shell))  # await under %time, %timeit, %%capture
    shell._last_traceback = []
    shell._formatting_error = None
    # IPython makes ProvisionalCompleterWarning an error (completer.py) that
    # provisionalcompleter() lifts with warnings.catch_warnings, which swaps
    # the process's filter list: a completion on another thread (a subshell)
    # that leaves it first puts the error back under the one still inside,
    # which then fails (about 2 in 300 concurrent completions). Ignored
    # process-wide instead, ahead of IPython's filter; every list a
    # catch_warnings saves then holds it. (A lock around completions would
    # hold up every shell behind one slow completion, user code included.)
    from IPython.core.completer import ProvisionalCompleterWarning

    warnings.filterwarnings("ignore", category=ProvisionalCompleterWarning)
    return shell


class InputForwarder:
    """Replaces input()/getpass() during a cell (stdin channel, spec "Messages on the stdin ROUTER/DEALER channel")."""

    def __init__(self, request: Callable[[str, bool], str]):
        self.request = request

    def input(self, prompt: str = "") -> str:
        """``input()`` during a cell: send ``prompt`` as an ``input_request`` (``password``
        false) to the requesting client over the stdin channel and return its ``input_reply``
        value. Blocks the calling thread until the answer. Raises IPython's
        StdinNotImplementedError when the request could not be delivered."""
        return self.request(str(prompt), False)

    def getpass(self, prompt: str = "Password: ", stream: Any = None) -> str:
        """``getpass.getpass()`` during a cell: as :meth:`input` with ``password`` true, so the
        frontend hides what is typed; ``stream`` is ignored. Blocks the calling thread. Raises
        IPython's StdinNotImplementedError when the request could not be delivered."""
        return self.request(str(prompt), True)


def _no_input(*args: Any, **kw: Any) -> str:
    # ipykernel's text, word for word (nbclient's tests compare it)
    raise StdinNotImplementedError("raw_input was called, but this frontend does not support input requests.")


def _no_getpass(*args: Any, **kw: Any) -> str:
    raise StdinNotImplementedError("getpass was called, but this frontend does not support input requests.")


async def execute(
    shell: TrikernelShell,
    content: dict[str, Any],
    request_input: Callable[[str, bool], str],
) -> dict[str, Any]:
    """Run an execute_request's code; returns execute_reply content.

    ``content``: the request content (code, silent, store_history,
    user_expressions, allow_stdin), its types checked by dispatch
    (``_check_execute_content``: code a string, flags booleans). The caller
    publishes execute_input.
    """
    code = content.get("code", "")
    silent = bool(content.get("silent", False))
    store_history = bool(content.get("store_history", not silent))
    user_expressions = content.get("user_expressions") or {}
    if not isinstance(user_expressions, dict):  # the spec's shape is {name: code}
        user_expressions = {}
    allow_stdin = bool(content.get("allow_stdin", False))

    fwd = InputForwarder(request_input)
    shell._last_traceback = []
    shell._formatting_error = None
    if isinstance(shell.displayhook, TrikernelDisplayHook):
        shell.displayhook.formatting = False  # left set if the last result's formatting raised out
    with lanestate.route_input(fwd.input if allow_stdin else _no_input, fwd.getpass if allow_stdin else _no_getpass):
        transformed, preprocessing_exc_tuple = awaitmagics.transform_cell(shell, code)
        try:
            try:
                result = await shell.run_cell_async(
                    code,
                    store_history=store_history,
                    silent=silent,
                    transformed_cell=transformed,
                    preprocessing_exc_tuple=preprocessing_exc_tuple,
                )
            except Exception as exc:  # IPython failed around the cell: shown, answered, never the kernel's
                log.debug("run_cell_async raised", exc_info=True)
                shell.showtraceback()
                result = ExecutionResult(None)
                result.error_in_exec = exc
            try:
                await _end_of_cell_checkpoint()
            except KeyboardInterrupt as exc:
                shell.showtraceback()
                result.error_in_exec = exc
        finally:
            shell.events.trigger("post_execute")
            if not silent:
                shell.events.trigger("post_run_cell", shell.last_execution_result)

    reply: dict[str, Any] = {"execution_count": shell.execution_count - 1}
    err = result.error_before_exec or result.error_in_exec
    formatting_error = shell._formatting_error
    if result.success and formatting_error is None:
        reply["status"] = "ok"
    elif err is None and formatting_error is not None:
        reply.update(formatting_error, status="error")
    else:
        reply["status"] = "error"
        reply["traceback"] = shell._last_traceback or []
        reply["ename"] = _ename(err)
        reply["evalue"] = tracebacks.safe_str(err) if err is not None else ""
    if reply["status"] == "ok":
        reply["user_expressions"] = shell.user_expressions(user_expressions)
    else:
        reply["user_expressions"] = {}
    payloads = shell._payloads()
    reply["payload"] = payloads.read_payload()
    payloads.clear_payload()
    return reply


#: Seconds the end of a cell waits at most for the tasks it left runnable
#: to block (_end_of_cell_checkpoint): bounds the cost when a background
#: task never blocks.
END_OF_CELL_WAIT = 0.001


async def _end_of_cell_checkpoint() -> None:
    """The checkpoint after a cell's code, inside the request (so before
    its fd flush, reply and idle). Two jobs:

    - tasks the cell has started (``nursery.start_soon``), the tasks they
      start, and callbacks queued meanwhile (a comm handler arriving during
      a sync cell) run until they block, so what they print before their
      first real wait is this cell's output, before its idle (clients such
      as nbclient stop reading at idle). ``trio.testing.
      wait_all_tasks_blocked`` waits for that (trio runs a batch in random
      order and does not expose it, so counting runnable tasks misses a
      task behind this one in the batch), at most END_OF_CELL_WAIT after
      two scheduler rounds (so a task already runnable always takes its
      first step, however slow the machine);
    - an interrupt that came while the cell waited on something trio cannot
      abort (``trio.to_thread.run_sync`` without ``abandon_on_cancel``) is
      pending until a checkpoint: it is taken here, as this cell's, not
      later as an "idle" interrupt.

    With nothing runnable and nothing queued, no trip through the scheduler:
    ``checkpoint_if_cancelled`` still raises a pending interrupt (trio
    checkpoints for the main task when one is pending) or cancellation. A
    full checkpoint is a trip through epoll, whose syscall lets the io
    thread take the GIL, on the path of every reply (issue 12). Tasks
    started from a subshell's cell run in the main user run and are not
    waited for here.
    """
    stats = trio.lowlevel.current_statistics()
    if not (stats.tasks_runnable or stats.run_sync_soon_queue_size):
        await trio.lowlevel.checkpoint_if_cancelled()
        return
    # trio.testing's own function, from where trio defines it: importing trio.testing imports
    # pytest when installed (93-155 ms, once; and user code then sees pytest in sys.modules)
    try:
        from trio._core._run import wait_all_tasks_blocked
    except ImportError:  # pragma: no cover - trio moved it: its public name
        from trio.testing import wait_all_tasks_blocked

    # two scheduler rounds, whatever the clock: every task runnable now takes
    # its step, also one behind this task in trio's batch (the time bound
    # alone cut even a single started task once on a loaded CI runner)
    for _ in range(2):
        await trio.lowlevel.checkpoint()
    with trio.move_on_after(END_OF_CELL_WAIT):
        await wait_all_tasks_blocked()


def _ename(err: BaseException | None) -> str:
    """The reply's ename; a group of only KeyboardInterrupts (an interrupted
    nursery in the cell) is reported as KeyboardInterrupt."""
    if err is None:
        return "UnknownError"
    if isinstance(err, BaseExceptionGroup):
        rest = err.split(KeyboardInterrupt)[1]
        if rest is None:
            return "KeyboardInterrupt"
    return type(err).__name__


def complete(shell: TrikernelShell, content: dict[str, Any]) -> dict[str, Any]:
    """``complete_request`` content → reply content (messaging spec
    "Completion"), with IPython's completer; any thread that runs a shell
    lane, several at once (subshells; see create_shell on the warning filter)."""
    from IPython.core.completer import provisionalcompleter, rectify_completions

    code = content.get("code", "")
    cursor_pos = content.get("cursor_pos")
    if cursor_pos is None:
        cursor_pos = len(code)
    with provisionalcompleter():
        raw = shell.Completer.completions(code, cursor_pos)
        completions = list(rectify_completions(code, raw))
    comps = [
        {"start": c.start, "end": c.end, "text": c.text, "type": c.type, "signature": c.signature} for c in completions
    ]
    if completions:
        start, end = completions[0].start, completions[0].end
    else:
        start = end = cursor_pos
    return {
        "status": "ok",
        "matches": [c.text for c in completions],
        "cursor_start": start,
        "cursor_end": end,
        "metadata": {"_jupyter_types_experimental": comps},
    }


def inspect(shell: TrikernelShell, content: dict[str, Any]) -> dict[str, Any]:
    """``inspect_request`` content → ``inspect_reply`` content (messaging spec "Introspection"):
    IPython's ``object_inspect_mime`` for the name at ``cursor_pos`` (code points; default the
    end) and ``detail_level`` (0 or 1); ``found`` false and empty ``data`` for an unknown
    name; ``text/html`` only with ``enable_html_pager``. Raises ValueError or TypeError for a
    ``detail_level`` that is no integer (the io run then answers with an error reply)."""
    code = content.get("code", "")
    cursor_pos = content.get("cursor_pos", len(code))
    detail = int(content.get("detail_level", 0))
    name = token_at_cursor(code, cursor_pos)
    reply: dict[str, Any] = {"status": "ok", "data": {}, "metadata": {}, "found": False}
    try:
        bundle = shell.object_inspect_mime(name, detail_level=detail)
        if not shell.enable_html_pager:
            bundle.pop("text/html", None)
        reply["data"] = bundle
        reply["found"] = True
    except KeyError:
        pass
    return reply


def is_complete(shell: TrikernelShell, content: dict[str, Any]) -> dict[str, Any]:
    """``is_complete_request`` content → ``is_complete_reply`` content (messaging spec "Code
    completeness"): ``status`` complete, incomplete or invalid from IPython's input
    transformers (``check_complete``), and for incomplete code the ``indent`` (spaces) of the
    next line."""
    status, indent = shell.input_transformer_manager.check_complete(content.get("code", ""))
    r: dict[str, Any] = {"status": status}
    if status == "incomplete":
        r["indent"] = " " * (indent or 0)
    return r


def history(shell: TrikernelShell, content: dict[str, Any]) -> dict[str, Any]:
    """``history_request`` content → ``history_reply`` content (messaging spec "History"):
    ``hist_access_type`` tail (``n``, default 10), range (``session``, ``start``, ``stop``) or
    search (``pattern``, ``n``, ``unique``); ``raw`` (default true) and ``output``. Entries
    are ``[session, line, input]`` (with output: ``[session, line, [input, output]]``), with
    the real session number instead of 0; any other access type gets ``[]``.

    Raises:
        TypeError: an ``n``, ``session``, ``start`` or ``stop`` that is no integer, or a
            ``pattern`` that is no string (an error reply). Checked before IPython sees them:
            IPython takes any SQLite error of a query as a corrupt database and moves the
            user's history file aside (``catch_corrupt_db``), so a request with
            ``"stop": {}`` would cost the user their history.
    """
    hm = shell.history_manager
    assert hm is not None, "IPython shell without a history manager"
    kind = content.get("hist_access_type", "tail")
    raw = bool(content.get("raw", True))
    output = bool(content.get("output", False))
    if kind == "tail":
        hist = hm.get_tail(_history_int(content, "n", None) or 10, raw=raw, output=output, include_latest=True)
    elif kind == "range":
        hist = hm.get_range(
            _history_int(content, "session", 0) or 0,
            _history_int(content, "start", 0) or 0,
            _history_int(content, "stop", None),
            raw=raw,
            output=output,
        )
    elif kind == "search":
        pattern = content.get("pattern", "*")
        if not isinstance(pattern, str):
            raise TypeError(f"history_request: pattern must be a string, not {type(pattern).__name__}")
        hist = hm.search(
            pattern, raw=raw, output=output, n=_history_int(content, "n", None), unique=bool(content.get("unique"))
        )
    else:
        hist = []
    # IPython reports the current session as 0 in ranges; give the real
    # number, as tail and search do, so clients can correlate entries.
    current = hm.session_number
    return {"status": "ok", "history": [[h[0] or current, *h[1:]] for h in hist]}


def _history_int(content: dict[str, Any], key: str, default: int | None) -> int | None:
    """``content[key]`` as a history_request integer (None stands for "not given")."""
    value = content.get(key, default)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise TypeError(f"history_request: {key} must be an integer, not {type(value).__name__}")
