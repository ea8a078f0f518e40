"""The JupyterLab visual debugger, on debugpy (messaging spec "Debug request",
"Debug event", "Additions to the DAP"; the Debug Adapter Protocol).

Which run or thread each part runs on:

- :class:`Debugger` and :class:`DapClient` run in the **io run** (io thread):
  debug requests are served one at a time by the core's debug lane
  (core/kernelcore.py, lane ``debug``), apart from the control channel's
  other requests, so one that waits on debugpy or on the main thread never
  holds up kernel_info or interrupt. The client talks to debugpy's
  adapter over a TCP stream of the io run; one reader task takes every DAP
  message off it: responses are matched to their request by
  ``request_seq`` (never by order), events go out on IOPub as
  ``debug_event`` through the IOPub queue.
- The **user run** (main thread) runs one job per process, the first time
  the debugger is turned on (:func:`_start_debugpy`): it marks every kernel
  thread not traced, imports debugpy and calls ``debugpy.listen(("127.0.0.1",
  0))`` there, since listen traces the thread that calls it and user code
  stops on the main thread. It runs as a task of the user nursery
  (``UserRun.start_task_soon``): while a cell computes, control keeps
  answering and ``initialize`` is answered when the cell yields or ends.
- :func:`available`: any thread. The shell's compiler (shell.py
  ``CellCompiler``) names every cell ``cellnames.cell_path(code)``
  (user/cellnames.py), the file name JupyterLab computes for the cell
  (``tmpFilePrefix + murmur2(code, hashSeed) + tmpFileSuffix``), so
  breakpoints set in the notebook match.

Nothing here imports debugpy at import time: a kernel that never turns the
debugger on never imports it and never traces.

What the kernel answers itself: ``debugInfo``, ``configurationDone``,
``dumpCell``, ``inspectVariables``, ``richInspectVariables``,
``copyToGlobals`` (as a ``setExpression``), ``modules``, ``source``, and
``variables`` / ``continue`` while no thread is stopped. Whatever of
these touches user objects (the Variables panel, ``modules``) runs as a job
of the main user run with a deadline (panel.py, variables.py), never here:
no code of the user's runs on the io thread. Everything else is forwarded
to debugpy. ``disconnect`` is forwarded with
``terminateDebuggee`` false whatever the client asked (true kills the
kernel process).

Runs on: the io run (:class:`Debugger`, in the core's debug lane); the
main thread's user run (the one start of debugpy, tracing on and off,
the ``pre_execute`` hook, the Variables panel's work); :func:`available`
any thread.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import linecache
import logging
import os
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from trikernel.core.job import Job
from trikernel.debug.dap import MAX_DAP_MESSAGE, REQUEST_TIMEOUT, DapClient, DapError
from trikernel.debug.panel import VariablesPanel
from trikernel.debug.variables import accept_stopped_variable
from trikernel.protocol.dap import response
from trikernel.threads import mark_kernel_threads
from trikernel.user import cellnames

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from IPython.core.interactiveshell import InteractiveShell

    from trikernel.core.interfaces import UserRunHandle
    from trikernel.protocol.messages import MessageBuilder
    from trikernel.server.iopubqueue import IOPubQueue

log = logging.getLogger("trikernel.debugger")

#: Seconds ``initialize`` waits for debugpy's adapter to accept the connection.
CONNECT_TIMEOUT = 10.0

#: Packages whose frames the debugger never shows or steps into (attach ``rules``).
HIDDEN_MODULES = ("trikernel", "trio", "outcome", "trio_asyncio", "sniffio", "IPython", "traitlets", "comm", "zmq")


# -- any thread ----------------------------------------------------------------------


def _hidden_rules() -> list[dict[str, Any]]:
    """debugpy ``rules`` that leave the kernel's machinery out: by module name
    and by directory (``python -m trikernel`` runs as ``__main__``)."""
    rules: list[dict[str, Any]] = [{"module": m, "include": False} for m in HIDDEN_MODULES]
    for m in HIDDEN_MODULES:
        spec = sys.modules.get(m)
        path = getattr(spec, "__file__", None)
        if isinstance(path, str):
            rules.append({"path": os.path.dirname(path), "include": False})
    return rules


_available: bool | None = None


def available() -> bool:
    """True when debugpy can be imported (found without importing it; cached).

    ``kernel_info_reply.supported_features`` lists ``"debugger"`` only then.
    """
    global _available
    if _available is None:
        try:
            _available = importlib.util.find_spec("debugpy") is not None
        except (ImportError, ValueError):
            _available = False
    return _available


# -- main thread: the one start of debugpy --------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """Where debugpy's adapter takes DAP clients (``debugpy.listen``'s answer)."""

    host: str
    port: int


def _start_debugpy(shell: InteractiveShell, rearm: Callable[[], None]) -> Endpoint:
    """Main thread, as a task of the user run; once per process.

    Marks the kernel threads not traced, then imports debugpy and listens on
    ``("127.0.0.1", 0)``: the adapter binds the port (none is picked and
    released, ipykernel#988). ``subProcess`` is off: debugpy does not inject
    itself into the Python processes user code starts. ``sys.breakpointhook``
    becomes debugpy's (its import installs it, as ipykernel's start-up does:
    ``breakpoint()`` stops while a client is attached), unless user code had
    set one of its own, which stays. Removes IPython's
    ``leading_empty_lines`` cleanup, so a cell that starts with blank lines
    keeps its line numbers, and registers ``rearm`` to run before every
    cell.
    """
    marked = mark_kernel_threads()
    log.info("debugger: threads not traced: %s", marked)
    hook = sys.breakpointhook
    import debugpy

    debugpy.configure(subProcess=False)
    host, port = debugpy.listen(("127.0.0.1", 0))
    from trikernel.user.kernelapp import breakpoint_without_debugger

    if hook is not breakpoint_without_debugger:
        sys.breakpointhook = hook  # one the user set: debugpy's import put its own in
    _keep_leading_lines(shell, True)
    shell.events.register("pre_execute", rearm)
    return Endpoint(str(host), int(port))


def _detached(shell: InteractiveShell) -> None:
    """Main thread, after the client disconnected: IPython's cleanup back,
    the main thread no longer traced."""
    _keep_leading_lines(shell, False)
    _trace_main_thread(False)


def _keep_leading_lines(shell: InteractiveShell, keep: bool) -> None:
    """Main thread: take IPython's ``leading_empty_lines`` cleanup out (keep
    True) or put it back first (keep False)."""
    from IPython.core.inputtransformer2 import leading_empty_lines

    cleanup = shell.input_transformer_manager.cleanup_transforms
    if keep and leading_empty_lines in cleanup:
        cleanup.remove(leading_empty_lines)
    elif not keep and leading_empty_lines not in cleanup:
        cleanup.insert(0, leading_empty_lines)


def _rearm_tracing() -> None:
    """Main thread, before each cell while a client is attached: if tracing
    of this thread is off — an exception (an interrupt while stopped at a
    breakpoint, ipykernel#821) escaped pydevd's trace function, or the last
    client disconnected — turn it back on so breakpoints stop again."""
    if sys.version_info < (3, 12) and sys.gettrace() is None:
        import debugpy

        debugpy.trace_this_thread(True)
        log.info("debugger: tracing of the main thread turned back on")


def _trace_main_thread(on: bool) -> None:
    """Main thread: trace it (a client attached) or stop tracing it (the
    client disconnected: without this, Python 3.11 keeps paying pydevd's
    trace function on every call after the debugger was turned off). Off
    also clears the trace function of the frames running now (trio's run
    loop), which Python would otherwise keep calling for their lines.

    The same holds for the threads started from then on, since pydevd keeps
    listening after a disconnect: on 3.11 it keeps ``threading.settrace``
    set for them; on 3.12+ (PEP 669) it keeps sys.monitoring tool id 0 with
    PY_START and PY_RESUME on for every thread. Off clears that hook, or
    frees the tool id (pydevd's own stop_monitoring for all threads); on
    puts it back (start_monitoring for all threads recomputes the events
    from the breakpoints set by then)."""
    import debugpy
    import pydevd  # debugpy's vendored pydevd: importable once debugpy listens

    monitoring = bool(getattr(pydevd, "PYDEVD_USE_SYS_MONITORING", False))
    if on:
        if monitoring:
            pydevd.pydevd_sys_monitoring.start_monitoring(all_threads=True)
        if monitoring or sys.gettrace() is None:
            debugpy.trace_this_thread(True)
        if not monitoring and threading.gettrace() is None:
            threading.settrace(pydevd.get_global_debugger().trace_dispatch)
        return
    debugpy.trace_this_thread(False)
    if monitoring:
        pydevd.pydevd_sys_monitoring.stop_monitoring(all_threads=True)
    else:
        threading.settrace(None)
    frame = sys._getframe()
    while frame is not None:
        frame.f_trace = None
        frame = frame.f_back  # type: ignore[assignment]


# -- io run: the debugger --------------------------------------------------------------


@dataclass(frozen=True)
class DebuggerDeps:
    """What the debugger needs from the kernel (all io-run objects).

    - ``builder``, ``queue``: build and queue IOPub ``debug_event``\\ s;
    - ``user_run``: the main thread's run, where debugpy starts (once);
    - ``just_my_code``: debugpy's ``justMyCode`` (library frames hidden).
    """

    builder: MessageBuilder
    queue: IOPubQueue
    user_run: UserRunHandle
    just_my_code: bool = True


class Debugger:
    """The kernel side of the JupyterLab debugger (io run only).

    :meth:`serve` is an io-run service (it owns the reader tasks);
    :meth:`handle` answers one ``debug_request``'s content with the
    ``debug_reply`` content (a DAP Response). Thread of the user code's
    stop: the main thread; the io run is never suspended (its thread is not
    traced) and never waits on the main thread except for the first start.
    """

    def __init__(self, deps: DebuggerDeps):
        self._d = deps
        self._nursery: trio.Nursery | None = None
        self._client: DapClient | None = None
        self._endpoint: Endpoint | None = None  # once debugpy listens (per process)
        self._lifecycle = trio.Lock()  # initialize / attach / disconnect one at a time
        self._initialized = trio.Event()
        self._attached = False
        self._shell: InteractiveShell | None = None
        self._parent: dict[str, Any] | None = None  # the latest debug_request's header
        self.breakpoints: dict[str, list[dict[str, Any]]] = {}
        self.stopped_threads: set[int] = set()
        #: the Variables panel while nothing is stopped: its work runs in the user run (panel.py)
        self.panel = VariablesPanel(deps.user_run)
        self._handlers: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
            "debugInfo": self._debug_info,
            "initialize": self._initialize,
            "attach": self._attach,
            "configurationDone": self._configuration_done,
            "dumpCell": self._dump_cell,
            "setBreakpoints": self._set_breakpoints,
            "inspectVariables": self._inspect_variables,
            "richInspectVariables": self._rich_inspect_variables,
            "copyToGlobals": self._copy_to_globals,
            "modules": self._modules,
            "source": self._source,
            "variables": self._variables,
            "continue": self._continue,
            "disconnect": self._disconnect,
        }

    @property
    def is_started(self) -> bool:
        """A client is connected to debugpy (debugInfo ``isStarted``)."""
        return self._client is not None and not self._client.closed

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The io-run service that owns the adapter connection's reader."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def handle(self, request: dict[str, Any], parent: dict[str, Any], shell: InteractiveShell) -> dict[str, Any]:
        """The ``debug_reply`` content for ``debug_request`` content ``request``.

        ``parent``: the request's header (the parent of the debug_events that
        follow); ``shell``: the IPython shell (user namespace). Never raises
        for a bad request or a debugpy failure: those are responses with
        ``success: false`` and a ``message``.
        """
        self._shell = shell
        self._parent = parent
        command = request.get("command")
        if not isinstance(command, str):
            return response(request, False, message="a debug request needs a 'command'")
        if not available():
            return response(
                request, False, message="the debugger needs debugpy, which is not installed: pip install debugpy"
            )
        handler = self._handlers.get(command)
        try:
            if handler is not None:
                return await handler(request)
            return await self._forward(request)
        except DapError as exc:
            return response(request, False, message=str(exc))

    # -- forwarding -------------------------------------------------------------------
    async def _forward(self, request: dict[str, Any], arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send ``request`` to debugpy under a sequence number of ours; the
        response goes back with the client's ``seq`` as ``request_seq``."""
        client = self._client
        if client is None or client.closed:
            return response(request, False, message="the debugger is not started (send initialize and attach first)")
        args = arguments if arguments is not None else request.get("arguments")
        answer = await client.request(str(request["command"]), args if isinstance(args, dict) else None)
        return self._as_reply(request, answer)

    def _as_reply(self, request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        reply = dict(answer)
        reply["request_seq"] = response(request)["request_seq"]
        reply["command"] = str(request.get("command", reply.get("command", "")))
        return reply

    # -- lifecycle --------------------------------------------------------------------
    async def _initialize(self, request: dict[str, Any]) -> dict[str, Any]:
        async with self._lifecycle:
            if self._endpoint is None:
                shell = self._shell
                assert shell is not None
                job = Job(_async(lambda: _start_debugpy(shell, self._rearm)))
                self._d.user_run.start_task_soon(job)
                await job.done.wait()
                if job.error is not None:
                    log.warning("debugpy did not start: %r", job.error)
                    return response(
                        request,
                        False,
                        message=f"debugpy did not start: {getattr(job.error, 'ename', type(job.error).__name__)}: "
                        f"{job.error}",
                    )
                self._endpoint = job.result
            if not self.is_started:
                await self._connect()
            return await self._forward(request)

    async def _connect(self) -> None:
        endpoint = self._endpoint
        assert endpoint is not None
        assert self._nursery is not None
        with trio.move_on_after(CONNECT_TIMEOUT):
            stream = await trio.open_tcp_stream(endpoint.host, endpoint.port)
            self._initialized = trio.Event()
            self._attached = False
            self._client = client = DapClient(stream, self._on_event)
            self._nursery.start_soon(self._read, client)
            return
        raise DapError(f"could not connect to debugpy at {endpoint.host}:{endpoint.port} within {CONNECT_TIMEOUT:g}s")

    async def _read(self, client: DapClient) -> None:
        await client.serve()
        if client is self._client:
            self.stopped_threads.clear()

    async def _attach(self, request: dict[str, Any]) -> dict[str, Any]:
        """``attach``: with the kernel's options, then debugpy's init sequence
        (``initialized`` event → ``configurationDone`` → the attach response)."""
        async with self._lifecycle:
            client = self._client
            if client is None or client.closed or self._endpoint is None:
                return response(request, False, message="the debugger is not started (send initialize first)")
            if self._attached:
                return response(request, True)
            args = dict(request.get("arguments") or {})
            args["connect"] = {"host": self._endpoint.host, "port": self._endpoint.port}
            args.setdefault("justMyCode", self._d.just_my_code)
            # kernel frames are never the user's: hidden from the call stack and from stepping
            args["rules"] = [*(args.get("rules") or []), *_hidden_rules()]
            # a stop suspends only the thread that hit it: kernel threads never stop
            args["stopAllThreadsOnSuspend"] = False
            args["subProcess"] = False
            handle = await client.send("attach", args)
            with trio.move_on_after(REQUEST_TIMEOUT):
                await self._initialized.wait()
            if not self._initialized.is_set():
                raise DapError("attach: debugpy sent no 'initialized' event")
            await client.request("configurationDone")
            answer = await client.wait(handle, "attach")
            self._attached = bool(answer.get("success"))
            if self._attached:
                # traced again at once, not only from the next cell (a task in trikernel.nursery)
                self._d.user_run.start_task_soon(Job(_async(lambda: _trace_main_thread(True))))
            return self._as_reply(request, answer)

    async def _configuration_done(self, request: dict[str, Any]) -> dict[str, Any]:
        return response(request, True)  # sent by the kernel itself during attach

    async def _disconnect(self, request: dict[str, Any]) -> dict[str, Any]:
        """``disconnect``: never with ``terminateDebuggee`` true (it kills
        the kernel). Breakpoints are cleared; debugpy stays listening, so a
        later initialize/attach connects again."""
        async with self._lifecycle:
            client = self._client
            args = dict(request.get("arguments") or {})
            args["terminateDebuggee"] = False
            args["restart"] = False
            if client is None or client.closed:
                reply = response(request, True)
            else:
                try:
                    reply = self._as_reply(request, await client.request("disconnect", args))
                except DapError as exc:
                    reply = response(request, True, message=f"disconnected ({exc})")
                await client.aclose()
            self._client = None
            self._attached = False
            self.breakpoints.clear()
            self.stopped_threads.clear()
            self.panel.forget()
            shell = self._shell
            if shell is not None and self._endpoint is not None:
                self._d.user_run.start_task_soon(Job(_async(lambda: _detached(shell))))
            return reply

    def _rearm(self) -> None:
        """shell ``pre_execute`` (main thread)."""
        if self.is_started:
            _rearm_tracing()
            shell = self._shell
            if shell is not None:
                _keep_leading_lines(shell, True)

    def after_interrupt(self) -> None:
        """An interrupt of the main run was delivered (io run, through its
        token; both interrupt modes). If user code was stopped at a
        breakpoint, KeyboardInterrupt left pydevd's wait loop with the
        thread still marked suspended, and the next cell would stop at its
        first line (ipykernel#821): resume those threads in pydevd (DAP
        ``continue``), which also tells the client they run again."""
        if self.stopped_threads and self.is_started and self._nursery is not None:
            self._nursery.start_soon(self._resume, sorted(self.stopped_threads))

    async def _resume(self, thread_ids: list[int]) -> None:
        client = self._client
        for tid in thread_ids:
            if client is None or client.closed:
                return
            try:
                await client.request("continue", {"threadId": tid})
            except DapError as exc:
                log.info("debugger: could not resume thread %s after an interrupt: %s", tid, exc)
            self.stopped_threads.discard(tid)

    # -- events (reader task) -----------------------------------------------------------
    async def _on_event(self, event: dict[str, Any]) -> None:
        name = event.get("event")
        raw = event.get("body")
        body: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if name == "initialized":
            self._initialized.set()
        elif name == "stopped":
            tid = body.get("threadId")
            if isinstance(tid, int):
                self.stopped_threads.add(tid)
            if body.get("allThreadsStopped") and self._nursery is not None:
                self._nursery.start_soon(self._add_all_threads)
        elif name == "continued":
            if body.get("allThreadsContinued", True):
                self.stopped_threads.clear()
            else:
                tid = body.get("threadId")
                if isinstance(tid, int):
                    self.stopped_threads.discard(tid)
        await self._d.queue.put(self._d.builder.iopub("debug_event", event, self._parent))

    async def _add_all_threads(self) -> None:
        client = self._client
        if client is None:
            return
        try:
            threads = await client.request("threads")
        except DapError:
            return
        for t in (threads.get("body") or {}).get("threads") or []:
            if isinstance(t.get("id"), int):
                self.stopped_threads.add(t["id"])

    # -- answered by the kernel -------------------------------------------------------
    async def _debug_info(self, request: dict[str, Any]) -> dict[str, Any]:
        return response(
            request,
            True,
            {
                "isStarted": self.is_started,
                "hashMethod": "Murmur2",
                "hashSeed": cellnames.HASH_SEED,
                "tmpFilePrefix": cellnames.cell_dir() + os.sep,
                "tmpFileSuffix": ".py",
                "breakpoints": [{"source": k, "breakpoints": v} for k, v in self.breakpoints.items()],
                "stoppedThreads": sorted(self.stopped_threads),
                "richRendering": True,
                "exceptionPaths": ["Python Exceptions"],
                "copyToGlobals": True,
            },
        )

    async def _dump_cell(self, request: dict[str, Any]) -> dict[str, Any]:
        code = _arguments(request).get("code")
        if not isinstance(code, str):
            return response(request, False, message="dumpCell needs arguments.code (a string)")
        path = cellnames.cell_path(code)
        _write_cell(path, code)
        return response(request, True, {"sourcePath": path})

    async def _set_breakpoints(self, request: dict[str, Any]) -> dict[str, Any]:
        source = _arguments(request).get("source") or {}
        path = source.get("path") if isinstance(source, dict) else None
        reply = await self._forward(request)
        if reply.get("success") and isinstance(path, str):
            lines = [
                {"line": b["line"]}
                for b in (reply.get("body") or {}).get("breakpoints") or []
                if b.get("verified", True) and "line" in b
            ]
            if lines:
                self.breakpoints[path] = lines
            else:
                self.breakpoints.pop(path, None)
        return reply

    async def _source(self, request: dict[str, Any]) -> dict[str, Any]:
        source = _arguments(request).get("source") or {}
        path = source.get("path") if isinstance(source, dict) else None
        if not isinstance(path, str):
            return response(request, False, message="source needs arguments.source.path")
        try:
            return response(request, True, {"content": _read_source(path)})
        except (OSError, UnicodeDecodeError):
            pass
        lines = linecache.cache.get(path)  # a cell that ran but was never dumped
        if lines is not None and len(lines) >= 3:
            return response(request, True, {"content": "".join(lines[2])})
        return response(request, False, {}, message="source unavailable")

    async def _inspect_variables(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._shell is not None
        return _answer(request, await self.panel.inspect(self._shell))

    async def _variables(self, request: dict[str, Any]) -> dict[str, Any]:
        if not self.stopped_threads:
            ref = _arguments(request).get("variablesReference")
            children = await self.panel.children(ref) if isinstance(ref, int) else None
            if isinstance(children, str):
                return response(request, False, message=children)
            if children is not None or not self.is_started:
                return response(request, True, {"variables": children or []})
        reply = await self._forward(request)
        body = reply.get("body")
        if reply.get("success") and isinstance(body, dict) and isinstance(body.get("variables"), list):
            shell = self._shell
            ns, hidden = (shell.user_ns, shell.user_ns_hidden) if shell is not None else ({}, {})
            body["variables"] = [
                v for v in body["variables"] if isinstance(v, dict) and accept_stopped_variable(v, ns, hidden)
            ]
        return reply

    async def _rich_inspect_variables(self, request: dict[str, Any]) -> dict[str, Any]:
        args = _arguments(request)
        name = args.get("variableName")
        if not isinstance(name, str) or not name.isidentifier():
            ok = name in ("special variables", "function variables")
            return response(request, ok, {"data": {}, "metadata": {}}, message=None if ok else "not a variable name")
        frame_id = args.get("frameId")
        if self.stopped_threads and isinstance(frame_id, int):
            # at a stop: formatted in the stopped frame, on the stopped thread
            expression = f"__import__('json').dumps(get_ipython().display_formatter.format({name}), default=str)"
            reply = await self._forward(
                {**request, "command": "evaluate"},
                {"expression": expression, "frameId": frame_id, "context": "clipboard"},
            )
            reply["command"] = "richInspectVariables"
            if not reply.get("success"):
                return reply
            try:
                data, metadata = json.loads(ast.literal_eval(reply["body"]["result"]))
            except (ValueError, SyntaxError, KeyError, TypeError):
                return response(request, False, message="could not read the formatted value")
        else:
            assert self._shell is not None
            return _answer(request, await self.panel.rich(self._shell, name))
        from trikernel.user.shell import clean_bundle

        data = clean_bundle(data or {})
        metadata = {k: v for k, v in (metadata or {}).items() if k in data}
        return response(request, True, {"data": data, "metadata": metadata})

    async def _copy_to_globals(self, request: dict[str, Any]) -> dict[str, Any]:
        args = _arguments(request)
        dst, src, frame_id = args.get("dstVariableName"), args.get("srcVariableName"), args.get("srcFrameId")
        if not (isinstance(dst, str) and dst.isidentifier() and isinstance(src, str) and isinstance(frame_id, int)):
            return response(
                request, False, message="copyToGlobals needs dstVariableName, srcVariableName and srcFrameId"
            )
        reply = await self._forward(
            {**request, "command": "setExpression"},
            {"expression": f"globals()['{dst}']", "value": src, "frameId": frame_id},
        )
        reply["command"] = "copyToGlobals"
        return reply

    async def _modules(self, request: dict[str, Any]) -> dict[str, Any]:
        args = _arguments(request)
        start, count = args.get("startModule", 0), args.get("moduleCount", 0)
        start = start if isinstance(start, int) and start >= 0 else 0
        count = count if isinstance(count, int) and count > 0 else 0
        return _answer(request, await self.panel.modules(start, count))

    async def _continue(self, request: dict[str, Any]) -> dict[str, Any]:
        """``continue``: forwarded while a thread is stopped; a continue with
        nothing stopped (a second click, ipykernel#1255) is answered here."""
        if not self.stopped_threads:
            return response(request, True, {"allThreadsContinued": True})
        return await self._forward(request)


# A cell file or a source file is small: read and written right in the io
# run. Not in a trio worker thread: one started after debugpy would be
# traced (pydevd decides when a thread starts, before it runs our code).
def _write_cell(path: str, code: str) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(code)


def _read_source(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read(MAX_DAP_MESSAGE)


def _arguments(request: dict[str, Any]) -> dict[str, Any]:
    args = request.get("arguments")
    return args if isinstance(args, dict) else {}


def _answer(request: dict[str, Any], body: dict[str, Any] | str) -> dict[str, Any]:
    """The response to ``request`` from a :class:`VariablesPanel` answer: a body, or a failure's message."""
    if isinstance(body, str):
        return response(request, False, message=body)
    return response(request, True, body)


def _async(fn: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
    async def run() -> Any:
        return fn()

    return run
