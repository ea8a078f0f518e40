"""Checks of stdin (input, getpass, allow_stdin=False) and of interrupts.

Interrupts follow the kernelspec's ``interrupt_mode`` (kernels.rst "Kernel
specs"; messaging "Kernel interrupt"): a signal through jupyter_client, or
an ``interrupt_request`` whose reply is checked too.

Spec: messaging "Messages on the stdin (ROUTER/DEALER) channel",
"Compatibility" (allow_stdin), "Kernel interrupt".

Runs on: the client side, the suite's thread only (the suite answers
``input_request`` on its stdin DEALER).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trikernel.conformance.catalogue import Ctx, check
from trikernel.conformance.client import stream_text
from trikernel.conformance.verdict import Verdict, failed, verdict
from trikernel.protocol import msgspec

if TYPE_CHECKING:
    from trikernel.conformance.received import Received

S = msgspec.SECTIONS
MARKER = "CONFORMANCE-STARTED"


def input_request_of(ctx: Ctx, h: dict[str, Any]) -> Received:
    """The input_request the execute ``h`` caused: one parented to it, or
    else any that arrives on stdin with another parent (the stdin checks
    then report the parent)."""
    ch = ctx.ch
    before = len(ch.orphans.get("stdin", []))

    def probe() -> Received | None:
        mine = [m for m in ch.for_parent(h["msg_id"], channel="stdin") if m.msg_type == "input_request"]
        if mine:
            return mine[0]
        stray = [m for m in ch.orphans.get("stdin", [])[before:] if m.msg_type == "input_request"]
        return stray[0] if stray else None

    return ch.wait(probe, ctx.t.reply, "input_request on stdin")


def _answer(ctx: Ctx, code: str, value: str) -> tuple[Received, Received, list[Received]]:
    """Run ``code`` (which asks for input) and answer with ``value``:
    (input_request, execute_reply, IOPub up to idle)."""
    h = ctx.ch.execute(code, allow_stdin=True)
    req = input_request_of(ctx, h)
    ctx.ch.send("stdin", "input_reply", {"value": value}, parent=req.header)
    reply, msgs = ctx.ch.exchange(h, ctx.t.reply)
    return req, reply, msgs


@check("stdin.input", S["input_request"])
def stdin_input(ctx: Ctx) -> Verdict:
    """input() sends input_request (prompt, password false) parented to the execute; the input_reply value reaches the
    code"""
    value = "conformance \u2713 answer"
    req, reply, msgs = _answer(ctx, ctx.code.read_input("conformance> "), value)
    c = req.content
    out = stream_text(msgs)
    fig = f"prompt {c.get('prompt')!r}, password {c.get('password')!r}; code got {out.strip()!r}"
    if c.get("prompt") != "conformance> " or c.get("password") is not False:
        return failed(fig)
    if req.parent_id != reply.parent_id:
        return failed(
            fig + f"; input_request parented to {req.parent_header.get('msg_type')!r}, not the execute_request"
        )
    return verdict(reply.content.get("status") == "ok" and value in out, fig)


@check("stdin.password", S["input_request"] + " (password: bool)")
def stdin_password(ctx: Ctx) -> Verdict:
    """getpass() sends input_request with password true (a boolean)"""
    req, reply, msgs = _answer(ctx, ctx.code.read_password("conformance password> "), "secret")
    pw = req.content.get("password")
    out = stream_text(msgs).strip()
    fig = f"password {pw!r} ({type(pw).__name__}); the code read {out} characters"
    return verdict(pw is True and out == "6" and reply.content.get("status") == "ok", fig)


@check("stdin.not_allowed", S["execute_request"] + " (allow_stdin); messaging § Compatibility")
def stdin_not_allowed(ctx: Ctx) -> Verdict:
    """with allow_stdin=False the kernel sends no input_request and answers at once"""
    h = ctx.ch.execute(ctx.code.read_input("conformance> "), allow_stdin=False, stop_on_error=False)
    try:
        reply = ctx.ch.reply(h, ctx.t.reply)
    finally:
        asked = [m for m in ctx.ch.for_parent(h["msg_id"], channel="stdin") if m.msg_type == "input_request"]
        if asked:  # answer it, so a failing kernel does not stay blocked
            ctx.ch.send("stdin", "input_reply", {"value": ""}, parent=asked[0].header)
    if asked:
        return failed("an input_request was sent although allow_stdin was false")
    c = reply.content
    return verdict(True, f"no input_request; reply {c.get('status')} {c.get('ename') or ''}".rstrip())
