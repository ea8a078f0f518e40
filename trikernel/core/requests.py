"""The handlers of requests served by a user run: the sequential, concurrent
and debug lanes (routes.py).

Each is ``async handler(core, ctx) -> Reply | None``. A sequential
request's body runs in its lane's user run as a :class:`~trikernel.core.job.Job`
(the interpreter's method: xeus's ``*_impl``); its reply may leave from that
run's thread as soon as the body returns (context.py,
``RequestContext.reply_early``).

Runs on: the io run.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trikernel.core.badinput import short
from trikernel.core.context import Reply
from trikernel.core.control import flag, request_error
from trikernel.errors import ProtocolError
from trikernel.protocol.dap import response as dap_response
from trikernel.protocol.wire import utcnow_iso

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from trikernel.core.context import RequestContext
    from trikernel.core.interfaces import Interpreter
    from trikernel.core.routes import CoreServices
    from trikernel.protocol.wire import Message

log = logging.getLogger("trikernel.dispatch")

#: execute_request's boolean fields (spec "Execute"); 0 and 1 pass as bools
_EXECUTE_FLAGS = ("silent", "store_history", "allow_stdin", "stop_on_error")


def check_execute_content(content: dict[str, Any]) -> None:
    """Refuse what would otherwise be coerced and run: ``code`` that is not a
    string (``5`` ran as ``"5"``), a flag that is not a boolean (``"false"``
    was true).

    Raises:
        ProtocolError (kind "bad_content"): an error reply, counted;
        ipykernel answers such requests with an error too.
    """
    code = content.get("code", "")
    if not isinstance(code, str):
        raise ProtocolError(f"execute_request: code must be a string, got {type(code).__name__}", "bad_content")
    for name in _EXECUTE_FLAGS:
        value = content.get(name)
        if value is not None and not isinstance(value, (bool, int)):
            raise ProtocolError(f"execute_request: {name} must be a boolean, got {type(value).__name__}", "bad_content")


def _succeeded(content: dict[str, Any]) -> bool:
    """Only a succeeded execute's reply may leave from the user run: a failed
    one opens the stop_on_error window first (io run, lanes.AbortWindow)."""
    return content.get("status") == "ok"


async def execute(core: CoreServices, ctx: RequestContext) -> Reply:
    """``execute_request`` (spec "Execute"). A failure with ``stop_on_error``
    (and not ``silent``) opens the lane's abort window before its reply
    leaves, so nothing the client sent after seeing it is aborted. A failed
    cell's reply carries ipykernel's ``engine_info`` (``engine_uuid``: the
    metadata's ``engine``, ``engine_id`` -1, ``method`` "execute")."""
    msg = ctx.msg
    check_execute_content(msg.content)
    started = utcnow_iso()
    engine = core.builder.session_id
    interp = await core.interpreter()

    def metadata(content: dict[str, Any]) -> dict[str, Any]:
        return {"started": started, "dependencies_met": True, "engine": engine, "status": content.get("status")}

    ctx.reply_early(metadata, _succeeded)
    content: dict[str, Any] = await core.run_job(lambda: interp.execute(msg), context=ctx)
    after = core.request_shutdown if asks_exit(content) else None
    if ctx.replied:
        return Reply(content, after=after)
    failed = content.get("status") == "error"
    if failed:
        # ipykernel's error reply has it (ipkernel.py do_execute: "deprecated piece for
        # ipyparallel"); its engine_uuid is the metadata's engine, as here
        content["engine_info"] = {"engine_uuid": engine, "engine_id": -1, "method": "execute"}
    on_sent = None
    if failed and flag(msg.content, "stop_on_error", True) and not flag(msg.content, "silent", False):
        lane = core.serving()
        if lane is not None and lane.current is not None and lane.current.msg is msg:
            on_sent = core.start_abort(lane, lane.current)
    return Reply(content, metadata(content), after=after, on_sent=on_sent)


def asks_exit(content: dict[str, Any]) -> bool:
    """Whether an ``execute_reply``'s payloads hold ``ask_exit`` without
    ``keepkernel`` (``exit()``, ``quit()``; messaging spec "Payloads"): the
    kernel then shuts down after that reply and its idle, as ipykernel stops
    (``exit(keep_kernel=True)`` keeps it)."""
    payloads = content.get("payload")
    return isinstance(payloads, list) and any(
        isinstance(p, dict) and p.get("source") == "ask_exit" and not p.get("keepkernel") for p in payloads
    )


def user_request(
    body: Callable[[Interpreter], Callable[[Message], dict[str, Any]]], *, concurrent: bool = False
) -> Callable[[CoreServices, RequestContext], Awaitable[Reply]]:
    """The handler of a request whose reply content is one synchronous
    interpreter method run in the user run (``body(interp)(msg)``);
    ``concurrent``: as a task of the run, not in the sequential lane."""

    async def handler(core: CoreServices, ctx: RequestContext) -> Reply:
        interp = await core.interpreter()
        if not concurrent:
            ctx.reply_early()
        result = await core.run_job(_sync(body(interp), ctx.msg), concurrent=concurrent, context=ctx)
        return Reply(result)

    return handler


async def comm(core: CoreServices, ctx: RequestContext) -> None:
    """``comm_open`` / ``comm_msg`` / ``comm_close``: the interpreter's comm
    handlers, as a concurrent job (no reply)."""
    interp = await core.interpreter()
    await core.run_job(_sync(interp.comm, ctx.msg), concurrent=True)


async def debug(core: CoreServices, ctx: RequestContext) -> Reply:
    """``debug_request``: the reply content is the DAP response
    (messaging spec "Debug request"; debug/debugger.py)."""
    response = await core.debug(ctx.msg.content, ctx.msg.header)
    if response is None:
        return Reply(dap_response(ctx.msg.content, False, message="this kernel has no debugger"))
    return Reply(response)


async def aborted(core: CoreServices, ctx: RequestContext) -> Reply:
    """An execute_request not run because an earlier one failed (stop_on_error).

    An ``error`` reply with ename ``ExecutionAborted`` and no
    ``execution_count``: the ``aborted`` status is deprecated since spec 5.1,
    which asks kernels for an error reply; the request got no count, and
    JupyterLab puts the reply's count on the cell's prompt (with one, the
    skipped cells of a "Run All" showed ``[2]:`` as if they had run; without,
    their prompt stays empty, as under ipykernel, whose ``aborted`` reply has
    no count). The metadata says ``status: aborted`` as ipykernel's does.
    """
    reply = request_error(
        ctx.msg.msg_type, "ExecutionAborted", "not run: an earlier request failed with stop_on_error set"
    )
    assert reply is not None
    metadata = {"status": "aborted", "engine": core.builder.session_id, "dependencies_met": True}
    return Reply(reply.content, metadata)


async def unknown_subshell(core: CoreServices, ctx: RequestContext) -> Reply | None:
    """A shell message for a ``subshell_id`` that names no subshell (JEP 91:
    an error). Requests get an error reply; every message gets busy/idle."""
    subshell_id = ctx.msg.header.get("subshell_id")
    log.info("%s for unknown subshell %s", ctx.msg.msg_type, short(repr(subshell_id)))
    return request_error(ctx.msg.msg_type, "UnknownSubshellError", f"Unknown subshell_id {subshell_id!r}")


async def subshell_deleted(core: CoreServices, ctx: RequestContext) -> Reply | None:
    """A request queued for a subshell that was deleted before it ran."""
    subshell_id = ctx.msg.header.get("subshell_id")
    return request_error(
        ctx.msg.msg_type, "SubshellDeleted", f"subshell {subshell_id!r} was deleted before this request ran"
    )


def _sync(fn: Callable[[Message], Any], msg: Message) -> Callable[[], Awaitable[Any]]:
    """An async job body that calls the synchronous ``fn(msg)``."""

    async def run() -> Any:
        return fn(msg)

    return run
