"""Checks of kernel_info, execution, the execution counter, errors, stop_on_error and busy/idle.

Spec: messaging "Kernel info", "Execute", "Execution counter", "Execution
results", "Execution errors", "Request-Reply", "Kernel status", "Code inputs".

Runs on: the client side, the suite's thread only (the runner runs each
check to its end, one at a time).
"""

from __future__ import annotations

import contextlib
import uuid
from typing import TYPE_CHECKING, Any

from trikernel.conformance.catalogue import Ctx, check
from trikernel.conformance.client import is_busy, is_idle, stream_text
from trikernel.conformance.verdict import Fail, Verdict, failed, passed, verdict
from trikernel.protocol import msgspec

if TYPE_CHECKING:
    from trikernel.conformance.received import Received

S = msgspec.SECTIONS
OUTPUTS = frozenset({"stream", "display_data", "update_display_data", "execute_result", "error", "clear_output"})


def _count(reply: Received) -> Any:
    return reply.content.get("execution_count")


def _counter_now(ctx: Ctx, **kw: Any) -> Any:
    """The execution_count in the reply to a no-op cell (stored unless ``kw``
    says otherwise); Fail unless it runs."""
    reply, _ = run_ok(ctx, ctx.code.noop, **kw)
    return _count(reply)


def run_ok(ctx: Ctx, code: str, **kw: Any) -> tuple[Received, list[Received]]:
    """Execute ``code``; Fail unless the reply says ok."""
    reply, msgs = ctx.ch.run(code, ctx.t.reply, **kw)
    if reply.content.get("status") != "ok":
        raise Fail(
            f"{code.splitlines()[0]!r:.40} got status {reply.content.get('status')!r} "
            f"({reply.content.get('ename')}: {str(reply.content.get('evalue'))[:80]})"
        )
    return reply, msgs


def unique(stem: str) -> str:
    """A fresh global name for the kernel's namespace, ``conformance_<stem>_<6 hex digits>``, so
    that a check's counters never meet those of an earlier check or run."""
    return f"conformance_{stem}_{uuid.uuid4().hex[:6]}"


def _violations(msg_type: str, content: Any) -> str:
    return "; ".join(str(v) for v in msgspec.validate_content(msg_type, content)[:2])


# -- kernel_info -------------------------------------------------------------------


def _kernel_info(ctx: Ctx, channel: str) -> Verdict:
    reply, _ = ctx.ch.request(channel, "kernel_info_request", {}, ctx.t.reply)
    if reply.channel != channel:
        return failed(f"reply came on {reply.channel}, not {channel}")
    c = reply.content
    bad = _violations("kernel_info_reply", c)
    if bad:
        return failed(bad)
    pv = str(c.get("protocol_version"))
    li = c.get("language_info") or {}
    fig = f"{c.get('implementation')} {c.get('implementation_version')}, protocol {pv}, language {li.get('name')}"
    return verdict(pv.startswith("5."), fig if pv.startswith("5.") else f"protocol_version {pv!r} is not 5.x")


@check("kernel_info.shell", S["kernel_info_reply"])
def kernel_info_shell(ctx: Ctx) -> Verdict:
    """kernel_info_reply on shell: status ok, full content, protocol 5.x"""
    return _kernel_info(ctx, "shell")


@check("kernel_info.control", S["kernel_info_reply"] + " (on control, new in 5.5)")
def kernel_info_control(ctx: Ctx) -> Verdict:
    """kernel_info_request on control is answered on control"""
    return _kernel_info(ctx, "control")


# -- execute -----------------------------------------------------------------------


@check("execute.stream", S["execute_request"] + "; " + S["stream"])
def execute_stream(ctx: Ctx) -> Verdict:
    """print() reaches IOPub as stdout; reply ok; execute_input echoes the code"""
    code = ctx.code.say("conformance hello")
    reply, msgs = run_ok(ctx, code)
    text = stream_text(msgs)
    inputs = [m for m in msgs if m.msg_type == "execute_input"]
    if text != "conformance hello\n":
        return failed(f"stdout was {text!r}, expected 'conformance hello\\n'")
    if len(inputs) != 1 or inputs[0].content.get("code") != code:
        return failed(
            f"{len(inputs)} execute_input messages; code echoed: {[m.content.get('code') for m in inputs]!r:.80}"
        )
    if inputs[0].content.get("execution_count") != _count(reply):
        return failed(f"execute_input count {inputs[0].content.get('execution_count')} != reply count {_count(reply)}")
    return passed(f"stdout {text!r}, execution_count {_count(reply)}")


@check("execute.result", S["execute_result"])
def execute_result(ctx: Ctx) -> Verdict:
    """an expression gives execute_result with text/plain and the reply's execution_count"""
    reply, msgs = run_ok(ctx, ctx.code.result)
    results = [m for m in msgs if m.msg_type == "execute_result"]
    if len(results) != 1:
        return failed(f"{len(results)} execute_result messages")
    c = results[0].content
    text = (c.get("data") or {}).get("text/plain")
    if text != ctx.code.result_text:
        return failed(f"text/plain {text!r}, expected {ctx.code.result_text!r}")
    if c.get("execution_count") != _count(reply):
        return failed(f"execute_result count {c.get('execution_count')} != reply count {_count(reply)}")
    return passed(f"text/plain {text!r}, execution_count {_count(reply)}")


@check("execute.counter", S["execute_reply"] + "; messaging § Execution counter")
def execute_counter(ctx: Ctx) -> Verdict:
    """each stored execution increments execution_count by one"""
    a = _counter_now(ctx)
    b = _counter_now(ctx)
    return verdict(isinstance(a, int) and b == a + 1, f"counts {a} then {b}")


@check("execute.store_history_false", "messaging § Execution counter")
def execute_store_history_false(ctx: Ctx) -> Verdict:
    """store_history=False does not advance the counter; the reply gives its current value"""
    n = _counter_now(ctx)
    off = _counter_now(ctx, store_history=False)
    after = _counter_now(ctx)
    fig = f"stored {n}, unstored reply {off}, next stored {after}"
    if after != n + 1:
        return failed(fig + f" (expected {n + 1}: the unstored request advanced the counter)")
    return verdict(off in (n, n + 1), fig)


@check("execute.silent", S["execute_request"] + " (silent)")
def execute_silent(ctx: Ctx) -> Verdict:
    """silent=True: no execute_input, no output, no execute_result; counter unchanged"""
    before = _counter_now(ctx)
    _reply, msgs = run_ok(ctx, ctx.code.say("conformance silent") + "\n" + ctx.code.result, silent=True)
    after = _counter_now(ctx)
    loud = sorted({m.msg_type for m in msgs if m.msg_type not in ("status",)})
    fig = f"IOPub of the silent request: {loud or 'status only'}; counts {before} -> {after}"
    return verdict(not loud and after == before + 1, fig)


@check("execute.user_expressions", S["execute_request"] + " (user_expressions)")
def execute_user_expressions(ctx: Ctx) -> Verdict:
    """user_expressions are evaluated; an error in one is reported in that key only"""
    exprs = {"good": ctx.code.result, "bad": ctx.code.error}
    reply, _ = run_ok(ctx, ctx.code.noop, user_expressions=exprs)
    ue = reply.content.get("user_expressions") or {}
    good, bad = ue.get("good") or {}, ue.get("bad") or {}
    text = (good.get("data") or {}).get("text/plain")
    fig = f"good: {good.get('status')} {text!r}; bad: {bad.get('status')} {bad.get('ename')}"
    return verdict(good.get("status") == "ok" and text == ctx.code.result_text and bad.get("status") == "error", fig)


@check("execute.error", S["error"] + "; " + msgspec.SEC_REQUEST_REPLY)
def execute_error(ctx: Ctx) -> Verdict:
    """an exception gives an error reply and one IOPub error with the same ename"""
    reply, msgs = ctx.ch.run(ctx.code.error, ctx.t.reply, stop_on_error=False)
    c = reply.content
    errors = [m for m in msgs if m.msg_type == "error"]
    want = ctx.code.error_ename
    fig = f"reply {c.get('status')} ename {c.get('ename')!r}; {len(errors)} IOPub error(s)"
    if c.get("status") != "error" or len(errors) != 1:
        return failed(fig)
    bad = _violations("execute_reply", c) or _violations("error", errors[0].content)
    if bad:
        return failed(bad)
    if c.get("ename") != want or errors[0].content.get("ename") != want:
        return failed(fig + f"; IOPub ename {errors[0].content.get('ename')!r}, expected {want!r}")
    return passed(fig)


@check("execute.display", S["update_display_data"])
def execute_display(ctx: Ctx) -> Verdict:
    """display_data with a display_id, then update_display_data with the same id"""
    _, msgs = run_ok(ctx, ctx.code.update_display("conformance-a", "conformance-b"))
    shown = [m for m in msgs if m.msg_type == "display_data"]
    updated = [m for m in msgs if m.msg_type == "update_display_data"]
    if len(shown) != 1 or len(updated) != 1:
        return failed(f"{len(shown)} display_data, {len(updated)} update_display_data")
    a = (shown[0].content.get("transient") or {}).get("display_id")
    b = (updated[0].content.get("transient") or {}).get("display_id")
    return verdict(isinstance(a, str) and a == b, f"display_id {a!r}, update's {b!r}")


@check("execute.input_first", S["execute_input"] + "; " + S["status"])
def execute_input_first(ctx: Ctx) -> Verdict:
    """IOPub order: busy, execute_input, outputs, idle"""
    _, msgs = run_ok(ctx, ctx.code.say("conformance order") + "\n" + ctx.code.result)
    order = [m.msg_type if m.msg_type != "status" else m.content.get("execution_state") for m in msgs]
    ok = (
        len(order) >= 4
        and order[0] == "busy"
        and order[1] == "execute_input"
        and order[-1] == "idle"
        and all(t in OUTPUTS for t in order[2:-1])
        and any(t in OUTPUTS for t in order[2:-1])
    )
    return verdict(ok, " < ".join(str(t) for t in order))


# -- busy / idle -------------------------------------------------------------------


def _queries(ctx: Ctx, history_n: int) -> list[tuple[str, dict[str, Any]]]:
    """complete, inspect, is_complete and a history tail of ``history_n``
    cells, sent on shell; (label, header). Needs the kernel's code snippets."""
    ch, code = ctx.ch, ctx.code
    inspect = {"code": code.inspect_found, "cursor_pos": len(code.inspect_found), "detail_level": 0}
    history = {"output": False, "raw": True, "hist_access_type": "tail", "n": history_n}
    return [
        ("complete", ch.send("shell", "complete_request", {"code": "pri", "cursor_pos": 3})),
        ("inspect", ch.send("shell", "inspect_request", inspect)),
        ("is_complete", ch.send("shell", "is_complete_request", {"code": code.complete_code})),
        ("history", ch.send("shell", "history_request", history)),
    ]


def _one_of_each(ctx: Ctx) -> list[tuple[str, dict[str, Any]]]:
    """One request of every kind the suite uses, sent; (label, header)."""
    ch = ctx.ch
    reqs: list[tuple[str, dict[str, Any]]] = [
        ("kernel_info (shell)", ch.send("shell", "kernel_info_request", {})),
        ("kernel_info (control)", ch.send("control", "kernel_info_request", {})),
        ("comm_info", ch.send("shell", "comm_info_request", {})),
    ]
    if ctx.has_code:
        reqs.append(("execute", ch.execute(ctx.code.say("conformance busy"))))
        reqs += _queries(ctx, history_n=2)
    return reqs


@check("status.busy_idle", S["status"] + " (busy/idle around every request, since 5.0)")
def status_busy_idle(ctx: Ctx) -> Verdict:
    """every request gets exactly one busy and one idle, in that order, parented to it"""
    ch = ctx.ch
    reqs = _one_of_each(ctx)
    bad: list[str] = []
    for label, h in reqs:
        try:
            ch.reply(h, ctx.t.reply)
        except Fail:
            bad.append(f"{label}: no reply")

    def all_idle() -> bool | None:
        return all(any(is_idle(m) for m in ch.for_parent(h["msg_id"], socket="iopub")) for _, h in reqs) or None

    with contextlib.suppress(Fail):  # one deadline for all: the replies are in, so every idle is due
        ch.wait(all_idle, ctx.t.reply, "idle statuses")
    ch.pump(0.05)
    for label, h in reqs:
        states = [
            m.content.get("execution_state")
            for m in ch.for_parent(h["msg_id"], socket="iopub")
            if m.msg_type == "status"
        ]
        if states != ["busy", "idle"]:
            bad.append(f"{label}: {states}")
    n = len(reqs)
    return verdict(not bad, f"{n - len(bad)} of {n} requests bracketed" + (f"; {'; '.join(bad)}" if bad else ""))


@check("status.reply_before_idle", msgspec.SEC_REQUEST_REPLY + "; " + S["status"])
def status_reply_before_idle(ctx: Ctx) -> Verdict:
    """the reply is sent before the idle status (kernel's header dates, else arrival order)"""
    reqs = _one_of_each(ctx)
    from trikernel.conformance.audit import _when

    late: list[str] = []
    judged = 0
    for label, h in reqs:
        reply = ctx.ch.reply(h, ctx.t.reply)
        msgs = ctx.ch.until_idle(h, ctx.t.reply)
        idle = next(m for m in msgs if is_idle(m))
        rd, idd = _when(reply.header.get("date")), _when(idle.header.get("date"))
        judged += 1
        if rd is not None and idd is not None:
            if idd < rd:
                late.append(f"{label}: idle stamped {(rd - idd).total_seconds() * 1000:.2f} ms before the reply")
        elif idle.seq < reply.seq:
            late.append(f"{label}: idle arrived before the reply")
    return verdict(
        not late, f"{judged - len(late)} of {judged} replies before idle" + (f"; {'; '.join(late)}" if late else "")
    )


# -- stop_on_error -------------------------------------------------------------------

QUEUED = 20


@check(
    "stop_on_error.run_all",
    S["execute_request"] + " (stop_on_error)",
    f"'Run All' with a failing first cell: none of {QUEUED} queued cells runs, their replies carry no "
    "execution_count; a cell sent after runs",
)
def stop_on_error_run_all(ctx: Ctx) -> Verdict:
    """Check ``stop_on_error.run_all`` (messaging spec "Execute", ``stop_on_error``): a cell that
    sleeps 0.3 s and raises, with :data:`QUEUED` cells sent behind it at once; PASS when it
    fails, none of the queued cells runs (their replies say error or aborted, with no
    ``execution_count``: they got none, and JupyterLab shows a reply's count as the cell's
    prompt) and a cell sent after their replies runs. The figure counts the queued cells
    that ran and the replies that carry a count."""
    ch, code = ctx.ch, ctx.code
    name = unique("ran")
    first = ch.execute(code.sleep_then_fail(0.3))
    queued = [ch.execute(code.increment(name)) for _ in range(QUEUED)]
    r0 = ch.reply(first, ctx.t.reply)
    replies = [ch.reply(h, ctx.t.reply) for h in queued]
    statuses = sorted({str(r.content.get("status")) for r in replies})
    counted = sum("execution_count" in r.content for r in replies if r.content.get("status") != "ok")
    _after, msgs = run_ok(ctx, code.show(name))
    ran = stream_text(msgs).strip()
    fig = (
        f"first cell {r0.content.get('status')}; {ran} of {QUEUED} queued cells ran; "
        f"their replies: {statuses}, {counted} with an execution_count; a cell sent after ran"
    )
    ok = r0.content.get("status") == "error" and ran == "0" and set(statuses) <= {"error", "aborted"}
    return verdict(ok and counted == 0, fig)


@check("stop_on_error.only_execute", S["execute_request"] + " (stop_on_error aborts the execution queue)")
def stop_on_error_only_execute(ctx: Ctx) -> Verdict:
    """requests other than execute queued behind a failing cell are answered normally"""
    ch, code = ctx.ch, ctx.code
    first = ch.execute(code.sleep_then_fail(0.3))
    reqs = [
        *_queries(ctx, history_n=1),
        ("kernel_info", ch.send("shell", "kernel_info_request", {})),
        ("comm_info", ch.send("shell", "comm_info_request", {})),
    ]
    ch.reply(first, ctx.t.reply)
    bad = []
    for label, h in reqs:
        r = ch.reply(h, ctx.t.reply)
        st = r.content.get("status")
        if st not in (("complete", "incomplete", "invalid", "unknown") if label == "is_complete" else ("ok",)):
            bad.append(f"{label}: {st} {r.content.get('ename') or ''}".strip())
    n = len(reqs)
    return verdict(not bad, f"{n - len(bad)} of {n} answered normally" + (f"; {'; '.join(bad)}" if bad else ""))


@check("stop_on_error.false", S["execute_request"] + " (stop_on_error=False)")
def stop_on_error_false(ctx: Ctx) -> Verdict:
    """with stop_on_error=False a queued cell runs after a failing one"""
    ch, code = ctx.ch, ctx.code
    name = unique("ran")
    first = ch.execute(code.sleep_then_fail(0.2), stop_on_error=False)
    second = ch.execute(code.increment(name))
    r0, r1 = ch.reply(first, ctx.t.reply), ch.reply(second, ctx.t.reply)
    _, msgs = run_ok(ctx, code.show(name))
    ran = stream_text(msgs).strip()
    fig = f"failing cell {r0.content.get('status')}; queued cell {r1.content.get('status')}, ran {ran} time(s)"
    return verdict(r1.content.get("status") == "ok" and ran == "1", fig)


__all__ = ["OUTPUTS", "is_busy", "run_ok", "unique"]
