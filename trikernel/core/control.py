"""The io-lane handlers: answered by the io run itself (routes.py, ``Lane.IO``).

kernel_info, connect, shutdown, interrupt and usage (messaging spec "Kernel
info", "Connect", "Kernel shutdown", "Kernel interrupt"; ipykernel 7's
``usage_request``),
the subshell requests (JEP 91), anything unknown, and anything
``--strict`` refused. Each is ``async handler(core, ctx) -> Reply | None``.

Runs on: the io run.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING, Any

import trio

from trikernel.core.badinput import short
from trikernel.core.context import Reply
from trikernel.protocol.strict import Refused, refusal

if TYPE_CHECKING:
    from trikernel.core.context import RequestContext
    from trikernel.core.routes import CoreServices

log = logging.getLogger("trikernel.dispatch")

#: Seconds a create_subshell_request waits for the new subshell's trio run.
SUBSHELL_START_TIMEOUT = 10.0
#: Seconds a delete_subshell_request of an idle subshell waits for its thread to end.
SUBSHELL_END_WAIT = 2.0


def flag(content: dict[str, Any], name: str, default: bool) -> bool:
    """A boolean field of ``content``; 0 and 1 count as booleans."""
    value = content.get(name, default)
    return value if isinstance(value, bool) else bool(value)


def error_reply(ename: str, evalue: str) -> Reply:
    """An error reply (``status: error``, empty traceback; spec "Request-Reply")."""
    return Reply({"status": "error", "ename": ename, "evalue": evalue, "traceback": []})


def request_error(msg_type: str, ename: str, evalue: str) -> Reply | None:
    """The error reply to a request that was not run; None for messages
    without a reply (comm messages).

    An ``execute_reply`` made here has no ``execution_count``: the request
    got none, and JupyterLab shows the count of the reply as the cell's
    prompt number (a cell aborted by ``stop_on_error`` showed ``[2]:`` as if
    it had run). The spec's error reply omits "the usual content of a
    successful reply" and its ``abort`` form has nothing but ``status``;
    ipykernel's aborted reply has no count either (docs/compatibility.md,
    "Frontend conventions")."""
    if not msg_type.endswith("_request"):
        return None
    return error_reply(ename, evalue)


async def kernel_info(core: CoreServices, ctx: RequestContext) -> Reply:
    """``kernel_info_request``: static content, answered while IPython loads."""
    return Reply(core.kernel_info())


async def connect(core: CoreServices, ctx: RequestContext) -> Reply:
    """``connect_request`` (messaging spec "Connect", deprecated since 5.1 but
    still sent by old clients; ipykernel answers it): the five ports."""
    return Reply({"status": "ok", **core.ports()})


async def shutdown(core: CoreServices, ctx: RequestContext) -> Reply:
    """``shutdown_request``: the reply, idle, then the shutdown begins."""
    restart = flag(ctx.msg.content, "restart", False)
    return Reply({"status": "ok", "restart": restart}, after=core.request_shutdown)


async def interrupt(core: CoreServices, ctx: RequestContext) -> Reply:
    """The kernel's interrupt (JEP 91: kernel-wide): the main shell's
    running code and, through ``UserRun.on_interrupt`` (as for a
    signal-mode interrupt), every busy subshell's."""
    core.main_run.interrupt()
    return Reply({"status": "ok"})


#: psutil Process objects kept between usage requests, by pid: ``cpu_percent()``
#: measures since the previous call on the same object (one kernel per process).
_processes: dict[int, Any] = {}


async def usage(core: CoreServices, ctx: RequestContext) -> Reply:
    """``usage_request`` (ipykernel 7, read by jupyter-resource-usage):
    hostname, pid, cpu_count, and with psutil installed the CPU percent
    and memory (PSS where the OS has it, else RSS, bytes) of the kernel
    and its children, the host's CPU percent and virtual memory."""
    return Reply(await trio.to_thread.run_sync(_usage))


def _usage() -> dict[str, Any]:
    global _processes
    content: dict[str, Any] = {"status": "ok", "hostname": socket.gethostname(), "pid": os.getpid()}
    try:
        import psutil
    except ImportError:
        content["cpu_count"] = os.cpu_count()
        return content
    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    _processes = {p.pid: _processes.get(p.pid, p) for p in procs}
    cpu = mem = 0.0
    for p in _processes.values():
        try:
            cpu += p.cpu_percent(None)
            info = p.memory_full_info()
            mem += getattr(info, "pss", info.rss)
        except psutil.Error:
            continue
    content["kernel_cpu"] = cpu
    content["kernel_memory"] = int(mem)
    host = psutil.cpu_percent(None)
    if host:
        content["host_cpu_percent"] = host
    content["cpu_count"] = psutil.cpu_count(logical=True)
    content["host_virtual_memory"] = dict(psutil.virtual_memory()._asdict())
    return content


async def unknown(core: CoreServices, ctx: RequestContext) -> Reply | None:
    """Anything not in the table: busy/idle (the bracket) and, for a
    ``*_request``, an error reply naming the type."""
    msg_type = ctx.msg.msg_type
    core.bad_input.record("shell/control", "unknown_msg_type", f"unknown message type {short(msg_type)}")
    if not msg_type.endswith("_request"):
        return None
    return error_reply("UnknownMessageType", f"trikernel does not handle {msg_type!r} on this channel")


async def refused(core: CoreServices, ctx: RequestContext) -> Reply | None:
    """A message ``--strict`` refused (protocol/strict.py): not run. A request
    gets an error reply with ``ename: ProtocolError``; anything else (comm
    messages: the spec defines no reply) an IOPub ``error`` parented to it."""
    msg = ctx.msg
    violations = msg.violations if isinstance(msg, Refused) else ()
    content = refusal(msg.msg_type, violations)
    if msg.msg_type.endswith("_request"):
        reply = request_error(msg.msg_type, content["ename"], content["evalue"])
        assert reply is not None
        reply.content["traceback"] = content["traceback"]
        return reply
    await core.publish(core.builder.iopub("error", content, msg.header))
    return None


# -- subshells (JEP 91), io lane on control --------------------------------------------


async def create_subshell(core: CoreServices, ctx: RequestContext) -> Reply:
    """``create_subshell_request``: a new subshell with its own thread and
    trio run; answered once that run takes requests."""
    subshells = core.subshells
    if subshells is None:
        return error_reply("RuntimeError", "this kernel does not offer subshells")
    run = subshells.create()
    core.open_lane(run)
    with trio.move_on_after(SUBSHELL_START_TIMEOUT):
        await run.ready.wait()
    if not run.ready.is_set():
        _drop(core, run.subshell_id)
        return error_reply("RuntimeError", f"the subshell did not start within {SUBSHELL_START_TIMEOUT}s")
    return Reply({"status": "ok", "subshell_id": run.subshell_id})


async def delete_subshell(core: CoreServices, ctx: RequestContext) -> Reply:
    """``delete_subshell_request``: answered at once. The subshell ends
    after the request it is running; requests queued for it get an
    error reply (``SubshellDeleted``). An idle subshell's thread has
    ended when the reply leaves (bounded by SUBSHELL_END_WAIT)."""
    subshell_id = ctx.msg.content.get("subshell_id")
    lane = core.lanes.get(subshell_id)
    if lane is None or core.subshells is None or lane.subshell_id is None:
        return error_reply("UnknownSubshellError", f"Unknown subshell_id {subshell_id!r}")
    idle = lane.idle
    _drop(core, lane.subshell_id)
    run = lane.user_run
    if idle:
        ended, thread = getattr(run, "ended", None), getattr(run, "thread", None)
        with trio.move_on_after(SUBSHELL_END_WAIT):
            if ended is not None:
                await ended.wait()
            if thread is not None:
                # ended is set from the thread's last lines, which may not have
                # run yet (threading.active_count() still counts it): no event
                # marks a thread's exit, so join it in a worker thread
                await trio.to_thread.run_sync(thread.join, SUBSHELL_END_WAIT, abandon_on_cancel=True)
    return Reply({"status": "ok"})


async def list_subshell(core: CoreServices, ctx: RequestContext) -> Reply:
    """``list_subshell_request``: the ids of the subshells (not the main
    shell's), in creation order."""
    return Reply({"status": "ok", "subshell_id": core.lanes.subshell_ids()})


def _drop(core: CoreServices, subshell_id: str) -> None:
    lane = core.lanes.remove(subshell_id)  # its task ends after its backlog, then stops its run
    if lane is not None and core.subshells is not None:
        core.subshells.forget(subshell_id)
        log.info("subshell %s deleted", subshell_id)
