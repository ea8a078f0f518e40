"""Checks of the other shell requests: is_complete, complete, inspect, history, comms; and debug.

Spec: messaging "Code completeness", "Completion", "Introspection",
"History", "Comm info", "Custom Messages", "Debug request", and the note
"cursor_pos and unicode offsets" (5.2: code points, not UTF-16 units).

Runs on: the client side, the suite's thread only (the runner runs each
check to its end, one at a time).
"""

from __future__ import annotations

import fnmatch
import uuid
from typing import TYPE_CHECKING, Any

from trikernel.conformance.catalogue import Ctx, check
from trikernel.conformance.checks_execute import run_ok, unique
from trikernel.conformance.client import is_busy, is_idle
from trikernel.conformance.verdict import Fail, Skip, Verdict, failed, passed, verdict
from trikernel.protocol import msgspec

if TYPE_CHECKING:
    from trikernel.conformance.received import Received

S = msgspec.SECTIONS


def _request(ctx: Ctx, msg_type: str, content: dict[str, Any]) -> Received:
    reply, _ = ctx.ch.request("shell", msg_type, content, ctx.t.reply)
    bad = msgspec.validate_content(reply.msg_type, reply.content)
    if bad:
        raise Fail("; ".join(str(v) for v in bad[:2]))
    return reply


@check("is_complete", S["is_complete_reply"])
def is_complete(ctx: Ctx) -> Verdict:
    """complete, incomplete (with indent) and invalid code are told apart"""
    code = ctx.code
    got = {}
    for want, sample in (
        ("complete", code.complete_code),
        ("incomplete", code.incomplete_code),
        ("invalid", code.invalid_code),
    ):
        r = _request(ctx, "is_complete_request", {"code": sample})
        got[want] = r.content.get("status")
        if want == "incomplete" and not isinstance(r.content.get("indent"), str):
            return failed(f"incomplete without an indent string: {r.content!r:.100}")
    return verdict(all(k == v for k, v in got.items()), ", ".join(f"{k} -> {v}" for k, v in got.items()))


def _complete(ctx: Ctx, prefix_text: str) -> Verdict:
    code = ctx.code
    name = unique("alpha")
    run_ok(ctx, code.assign(name, 1))
    typed = name[:-3]
    text = prefix_text + typed
    pos = len(text)  # code points (spec 5.2)
    r = _request(ctx, "complete_request", {"code": text, "cursor_pos": pos})
    c = r.content
    start, end = c.get("cursor_start"), c.get("cursor_end")
    found = name in (c.get("matches") or [])
    fig = (
        f"cursor_pos {pos}: match {'found' if found else 'missing'}, "
        f"cursor_start {start} (expected {pos - len(typed)}), cursor_end {end} (expected {pos})"
    )
    return verdict(found and start == pos - len(typed) and end == pos, fig)


@check("complete", S["complete_reply"])
def complete(ctx: Ctx) -> Verdict:
    """completing a defined name: the match, cursor_start and cursor_end"""
    return _complete(ctx, "")


@check("complete.non_bmp", "messaging § cursor_pos and unicode offsets (5.2)")
def complete_non_bmp(ctx: Ctx) -> Verdict:
    """cursor_pos counts code points: two non-BMP characters before the cursor shift nothing"""
    return _complete(ctx, 's = "\U0001d41a\U0001f600"; ')


@check("inspect", S["inspect_reply"])
def inspect(ctx: Ctx) -> Verdict:
    """inspecting a known name: found with text/plain; an unknown name: found false"""
    code = ctx.code
    r = _request(
        ctx, "inspect_request", {"code": code.inspect_found, "cursor_pos": len(code.inspect_found), "detail_level": 0}
    )
    text = (r.content.get("data") or {}).get("text/plain", "")
    r2 = _request(
        ctx,
        "inspect_request",
        {"code": code.inspect_missing, "cursor_pos": len(code.inspect_missing), "detail_level": 0},
    )
    fig = (
        f"{code.inspect_found!r}: found {r.content.get('found')}, {len(text)} chars of text/plain; "
        f"{code.inspect_missing!r}: found {r2.content.get('found')}"
    )
    return verdict(r.content.get("found") is True and bool(text) and r2.content.get("found") is False, fig)


def _history_setup(ctx: Ctx) -> list[str]:
    """Run three stored cells; their code, in order."""
    stem = f"conformance_hist_{uuid.uuid4().hex[:6]}"
    cells = [ctx.code.assign(f"{stem}_{i}", i) for i in range(1, 4)]
    for cell in cells:
        run_ok(ctx, cell)
    return cells


def _history(ctx: Ctx, access: str, **query: Any) -> Received:
    """The history_reply to a raw, input-only request of ``hist_access_type``
    ``access`` with the further ``query`` fields."""
    return _request(ctx, "history_request", {"output": False, "raw": True, "hist_access_type": access, **query})


def _inputs(reply: Received) -> list[Any]:
    return [
        e[2] if not isinstance(e[2], list) else e[2][0]
        for e in reply.content.get("history") or []
        if isinstance(e, list) and len(e) == 3
    ]


@check("history.tail", S["history_reply"] + " (hist_access_type 'tail')")
def history_tail(ctx: Ctx) -> Verdict:
    """the last n cells, newest last, as (session, line, input)"""
    cells = _history_setup(ctx)
    r = _history(ctx, "tail", n=3)
    got = _inputs(r)
    return verdict(
        got[-3:] == cells,
        f"{len(got)} entries; last 3 {'match' if got[-3:] == cells else 'are ' + repr(got[-3:])[:80]}",
    )


@check("history.range", S["history_reply"] + " (hist_access_type 'range')")
def history_range(ctx: Ctx) -> Verdict:
    """a range of the current session holds the cells run, with line numbers in range"""
    cells = _history_setup(ctx)
    r = _history(ctx, "range", session=0, start=1, stop=100000)
    entries = r.content.get("history") or []
    got = _inputs(r)
    lines_ok = all(isinstance(e[1], int) and 1 <= e[1] < 100000 for e in entries if isinstance(e, list) and len(e) == 3)
    have = all(c in got for c in cells)
    return verdict(
        have and lines_ok,
        f"{len(entries)} entries; our 3 cells {'present' if have else 'missing'}; "
        f"line numbers {'in' if lines_ok else 'out of'} range",
    )


@check("history.search", S["history_reply"] + " (hist_access_type 'search')")
def history_search(ctx: Ctx) -> Verdict:
    """a glob search returns only matching cells, ours among them"""
    cells = _history_setup(ctx)
    pattern = cells[0].split("_1 =")[0] + "_*"
    r = _history(ctx, "search", pattern=pattern, n=10, unique=True)
    got = _inputs(r)
    wrong = [g for g in got if not fnmatch.fnmatchcase(str(g), pattern)]
    have = all(c in got for c in cells)
    return verdict(
        have and not wrong,
        f"pattern {pattern!r}: {len(got)} entries, {len(wrong)} not matching; ours {'present' if have else 'missing'}",
    )


# -- comms ---------------------------------------------------------------------------


def _comm_ids(ctx: Ctx, target: str | None = None) -> dict[str, Any]:
    content = {"target_name": target} if target else {}
    r = _request(ctx, "comm_info_request", content)
    comms = r.content.get("comms")
    if not isinstance(comms, dict):
        raise Fail(f"comm_info_reply comms is {comms!r:.60}")
    return comms


@check("comm_info", S["comm_info_reply"])
def comm_info(ctx: Ctx) -> Verdict:
    """comm_info_reply: status ok, comms a dict (filtered by target_name)"""
    every = _comm_ids(ctx)
    none = _comm_ids(ctx, "conformance.no_such_target")
    return verdict(not none, f"{len(every)} comms open; {len(none)} for an unused target")


def _comm_iopub(ctx: Ctx, h: dict[str, Any], msg_type: str) -> list[Received]:
    """The ``msg_type`` messages parented to comm message ``h``; Fail without busy/idle
    (spec "Custom Messages, Output Side Effects")."""
    msgs = ctx.ch.until_idle(h, ctx.t.reply)
    if not any(is_busy(m) for m in msgs):
        raise Fail(f"no busy status for the {h['msg_type']}")
    return [m for m in msgs if m.msg_type == msg_type]


@check("comm.lifecycle", S["comm_open"] + "; " + S["comm_msg"] + "; " + S["comm_close"])
def comm_lifecycle(ctx: Ctx) -> Verdict:
    """comm_open to a registered target, comm_msg echoed, comm_info lists it, comm_close removes it; busy/idle around
    each"""
    ch = ctx.ch
    target = f"conformance.echo.{uuid.uuid4().hex[:6]}"
    run_ok(ctx, ctx.code.echo_comm_target(target))
    cid = uuid.uuid4().hex
    steps = []
    h = ch.send("shell", "comm_open", {"comm_id": cid, "target_name": target, "data": {}})
    opened = _comm_iopub(ctx, h, "comm_msg")
    steps.append(f"open: {len(opened)} comm_msg")
    if not opened or opened[0].content.get("data") != {"opened": True}:
        return failed(
            "; ".join(steps) + " (the target's greeting {'opened': True} did not come, parented to the comm_open)"
        )
    listed = _comm_ids(ctx, target)
    if listed.get(cid, {}).get("target_name") != target:
        return failed(f"comm_info for {target!r} lists {listed!r:.80}")
    h = ch.send("shell", "comm_msg", {"comm_id": cid, "data": {"x": 1}})
    echoed = _comm_iopub(ctx, h, "comm_msg")
    if len(echoed) != 1 or echoed[0].content.get("data") != {"echo": {"x": 1}}:
        return failed(f"comm_msg echo parented to the comm_msg: {[m.content for m in echoed]!r:.100}")
    h = ch.send("shell", "comm_close", {"comm_id": cid, "data": {}})
    _comm_iopub(ctx, h, "comm_close")
    left = _comm_ids(ctx, target)
    return verdict(
        cid not in left,
        "opened, listed, echoed {'x': 1}, closed; "
        f"after close comm_info {'still lists it' if cid in left else 'is empty'}",
    )


@check("comm.unknown_target", S["comm_open"] + " (unknown target: reply with comm_close)")
def comm_unknown_target(ctx: Ctx) -> Verdict:
    """comm_open to an unknown target is answered with a comm_close of that comm_id"""
    cid = uuid.uuid4().hex
    h = ctx.ch.send("shell", "comm_open", {"comm_id": cid, "target_name": "conformance.no_such_target", "data": {}})
    msgs = ctx.ch.until_idle(h, ctx.t.reply)
    closes = [m for m in msgs if m.msg_type == "comm_close" and m.content.get("comm_id") == cid]
    if not closes:  # late comm_close (after idle) still counts, within a short grace
        ctx.ch.pump(ctx.t.quiet)
        closes = [m for m in ctx.ch.for_parent(h["msg_id"]) if m.msg_type == "comm_close"]
    busy = any(is_busy(m) for m in msgs) and any(is_idle(m) for m in msgs)
    return verdict(bool(closes), f"{len(closes)} comm_close for the comm_id; busy/idle {'yes' if busy else 'no'}")


# -- debug ---------------------------------------------------------------------------


@check("debug.info", S["debug_request"] + " (debugInfo, Additions to the DAP)")
def debug_info(ctx: Ctx) -> Verdict:
    """a kernel that supports the debugger answers debugInfo on control with a DAP response"""
    info = ctx.k.info
    if "debugger" not in (info.get("supported_features") or []) and info.get("debugger") is not True:
        raise Skip("kernel_info declares no debugger")
    h = ctx.ch.send("control", "debug_request", {"type": "request", "seq": 1, "command": "debugInfo", "arguments": {}})
    r = ctx.ch.reply(h, ctx.t.reply, channel="control")
    bad = msgspec.validate_content("debug_reply", r.content)
    c = r.content
    if bad:
        return failed("; ".join(str(v) for v in bad[:2]))
    body = c.get("body") or {}
    fig = (
        f"success {c.get('success')}, command {c.get('command')!r}, "
        f"request_seq {c.get('request_seq')}, body keys {sorted(body)[:4]}"
    )
    ok = c.get("success") is True and c.get("command") == "debugInfo" and "isStarted" in body
    return verdict(ok, fig)


__all__ = ["passed"]
