"""Checks of interrupts, in the kernelspec's ``interrupt_mode``.

kernels.rst "Kernel specs": ``signal`` (SIGINT, sent by jupyter_client's
``KernelManager.interrupt_kernel``) or ``message`` (an ``interrupt_request``
on control, sent by the suite so that its ``interrupt_reply`` is checked
too). Each check interrupts a cell (sleeping, spinning, waiting in
``input()``), expects an error reply within ``Deadlines.interrupt`` and then
a normal run of the next cell. They run last among the shared checks: a
kernel that does not survive is restarted for what follows.

Spec: messaging "Kernel interrupt"; kernels.rst "Kernel specs".

Runs on: the client side, the suite's thread only (a signal through
jupyter_client, or an interrupt_request on the suite's control socket).
"""

from __future__ import annotations

import time

from trikernel.conformance.catalogue import Ctx, check
from trikernel.conformance.checks_execute import run_ok
from trikernel.conformance.checks_stdin import input_request_of
from trikernel.conformance.client import stream_text
from trikernel.conformance.verdict import Fail, Verdict, failed, verdict
from trikernel.protocol import msgspec

S = msgspec.SECTIONS
MARKER = "CONFORMANCE-STARTED"


def _interrupt(ctx: Ctx, code: str, *, stdin: bool) -> Verdict:
    ch = ctx.ch
    h = ch.execute(code, allow_stdin=stdin, stop_on_error=False)  # the next cell follows at once
    if stdin:
        input_request_of(ctx, h)
    else:
        ch.wait(
            lambda: MARKER in stream_text(ch.for_parent(h["msg_id"], socket="iopub")) or None,
            ctx.t.reply,
            "the cell's start marker",
        )
    t0 = time.monotonic()
    ireq = ctx.k.interrupt()
    mode = ctx.k.interrupt_mode
    try:
        reply = ch.reply(h, ctx.t.interrupt, channel="shell")
    except Fail:
        died = "the kernel exited" if not ctx.k.alive() else "the cell still runs"
        ctx.k.restart()
        raise Fail(
            f"no execute_reply within {ctx.t.interrupt:g} s of the interrupt ({mode} mode); {died}; restarted"
        ) from None
    dt = time.monotonic() - t0
    extra = ""
    if ireq is not None:
        ir = ch.reply(ireq, ctx.t.reply, channel="control")
        extra = f"; interrupt_reply {ir.content.get('status')}"
        if ir.content.get("status") != "ok":
            return failed(f"interrupt_reply status {ir.content.get('status')!r}")
    c = reply.content
    _nxt, msgs = run_ok(ctx, ctx.code.say("conformance after"))
    ran = stream_text(msgs) == "conformance after\n"
    fig = (
        f"reply {c.get('status')} {c.get('ename') or ''} {dt * 1000:.0f} ms after the interrupt ({mode} mode)"
        f"{extra}; next cell {'ran' if ran else 'did not run'}"
    )
    return verdict(c.get("status") == "error" and ran, fig)


@check("interrupt.sleep", S["interrupt_request"] + "; kernels § Kernel specs (interrupt_mode)")
def interrupt_sleep(ctx: Ctx) -> Verdict:
    """interrupting a sleeping cell ends it with an error reply; the next cell runs"""
    return _interrupt(ctx, ctx.code.marker_sleep(MARKER, 30), stdin=False)


@check("interrupt.busy_loop", S["interrupt_request"] + "; kernels § Kernel specs (interrupt_mode)")
def interrupt_busy_loop(ctx: Ctx) -> Verdict:
    """interrupting a busy loop ends it with an error reply; the next cell runs"""
    return _interrupt(ctx, ctx.code.marker_loop(MARKER), stdin=False)


@check("interrupt.input", S["interrupt_request"] + "; " + S["input_request"])
def interrupt_input(ctx: Ctx) -> Verdict:
    """interrupting a pending input() ends the cell with an error reply; the next cell runs"""
    return _interrupt(ctx, ctx.code.read_input("conformance> "), stdin=True)
