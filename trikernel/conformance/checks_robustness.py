"""Checks of bad input (wrong signature, replay, malformed frames, unknown types) and the heartbeat.

A kernel must ignore a message it cannot trust or parse and keep serving
(kernels.rst "Handling messages": "Messages on the control and shell
sockets should be parsed, and their signature validated"). Unknown message
types may go unanswered (messaging "Compatibility") but, like every
request since 5.0, get busy/idle; a reply, if any, must say ``error``.
Whether later requests are still served is decided by a *fence*: a no-op
request sent after the bad input, which a kernel answers only after it.

Spec: messaging "The Wire Protocol", "Compatibility", "Kernel status",
"Heartbeat for kernels"; kernels.rst "Handling messages".

Runs on: the client side, the suite's thread only (raw frames sent from
the suite's own sockets).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from trikernel.conformance.catalogue import Ctx, check
from trikernel.conformance.checks_execute import run_ok, unique
from trikernel.conformance.client import DELIM, dumps, is_idle, stream_text
from trikernel.conformance.verdict import Skip, Verdict, failed, passed, verdict
from trikernel.protocol import msgspec

if TYPE_CHECKING:
    from trikernel.conformance.received import Received

S = msgspec.SECTIONS
SEC_WIRE = "messaging § The Wire Protocol; kernels § Handling messages"
UNKNOWN = "conformance_unknown_request"


def _fence(ctx: Ctx) -> None:
    """Fail unless the kernel answers a request sent after everything so far."""
    ctx.k.fence(ctx.code.noop if ctx.has_code else None, ctx.t.reply)
    ctx.ch.pump(0.05)


def _answered(ctx: Ctx, msg_id: str) -> list[Received]:
    return ctx.ch.for_parent(msg_id)


def _probe(ctx: Ctx, name: str) -> tuple[dict[str, Any], list[bytes]]:
    """``(header, frames)`` of a correctly signed request whose running shows:
    an execute_request counting in global ``name`` where the kernel runs code
    (:func:`_counter` reads it), else a kernel_info_request. Skip where the
    connection has no key (nothing is signed, so nothing to tamper with)."""
    if not ctx.ch.key:
        raise Skip("the connection has no key: messages are not signed")
    if ctx.has_code:
        return ctx.ch.frames("execute_request", ctx.ch.execute_content(ctx.code.increment(name)))
    return ctx.ch.frames("kernel_info_request", {})


def _counter(ctx: Ctx, name: str) -> str:
    _, msgs = run_ok(ctx, ctx.code.show(name))
    return stream_text(msgs).strip()


@check("bad_input.signature", SEC_WIRE + " (HMAC)")
def bad_signature(ctx: Ctx) -> Verdict:
    """a request with a wrong or empty signature is dropped: no reply, no busy, no effect; the kernel serves on"""
    ch = ctx.ch
    name = unique("badsig")
    sent = []
    for label, sig in (("wrong HMAC", b"0" * 64), ("empty signature", b""), ("garbage", b"not-a-signature")):
        h, frames = _probe(ctx, name)
        frames[1] = sig
        ch.send_frames("shell", frames, h)
        sent.append((label, h))
    _fence(ctx)
    answered = [
        f"{label}: {sorted({m.msg_type for m in _answered(ctx, h['msg_id'])})}"
        for label, h in sent
        if _answered(ctx, h["msg_id"])
    ]
    ran = _counter(ctx, name) if ctx.has_code else "0"
    fig = f"{len(sent)} badly signed requests: {len(answered)} answered, code ran {ran} time(s); the kernel served on"
    return verdict(not answered and ran == "0", fig + (f" ({'; '.join(answered)})" if answered else ""))


@check("bad_input.replay", SEC_WIRE + " (a signature seen before; jupyter_client Session's replay guard)")
def bad_replay(ctx: Ctx) -> Verdict:
    """the same signed frames sent twice run once"""
    ch = ctx.ch
    name = unique("replay")
    h, frames = _probe(ctx, name)
    ch.send_frames("shell", list(frames), h)
    ch.reply(h, ctx.t.reply)
    ch.send_frames("shell", list(frames))
    _fence(ctx)
    replies = [m for m in _answered(ctx, h["msg_id"]) if m.channel == "shell"]
    ran = _counter(ctx, name) if ctx.has_code else str(len(replies))
    return verdict(
        len(replies) == 1 and ran == "1", f"replayed once: {len(replies)} replies, the code ran {ran} time(s)"
    )


def _malformed(ch: Any) -> list[list[bytes]]:
    """Signed messages that are not Jupyter messages (fresh ids each time: no replays)."""
    _, good = ch.frames("kernel_info_request", {})
    hdr, par, md, cnt = good[2:6]
    no_type = dumps({k: v for k, v in ch.header("x").items() if k != "msg_type"})
    bodies = [
        [b"{not json", par, md, cnt],
        [b"[1, 2]", par, md, cnt],
        [no_type, par, md, cnt],
        [dumps(ch.header("execute_request")), par, md, b'"code"'],
        [dumps(ch.header("kernel_info_request")), par, md, b"\xff\xfe{}"],
        [dumps(ch.header("kernel_info_request")), par],
    ]
    out = [[DELIM, ch.signer.sign(parts), *parts] for parts in bodies]
    out.append([hdr, par, md, cnt])  # no delimiter, no signature
    return out


@check("bad_input.malformed", SEC_WIRE)
def bad_malformed(ctx: Ctx) -> Verdict:
    """malformed messages on shell and control (bad JSON, no msg_type, too few frames, no delimiter, non-UTF-8) are
    dropped; the kernel serves on"""
    ch = ctx.ch
    sent = 0
    for channel in ("shell", "control"):
        for frames in _malformed(ch):
            ch.send_frames(channel, frames)
            sent += 1
    _fence(ctx)
    ch.request("control", "kernel_info_request", {}, ctx.t.reply)
    alive = ctx.k.alive()
    fig = f"{sent} malformed messages on shell and control; the kernel "
    return verdict(alive, fig + ("served on (shell and control answered)" if alive else "died"))


def _unknown(ctx: Ctx, channel: str) -> Verdict:
    ch = ctx.ch
    h = ch.send(channel, UNKNOWN, {})
    if channel == "control":
        ch.request("control", "kernel_info_request", {}, ctx.t.reply)
    _fence(ctx)  # requests are handled in order: the unknown one's busy/idle came first
    ch.pump(ctx.t.quiet)
    msgs = ch.for_parent(h["msg_id"], socket="iopub")
    bracket = [m.content.get("execution_state") for m in msgs if m.msg_type == "status"] == ["busy", "idle"]
    replies = [m for m in _answered(ctx, h["msg_id"]) if m.channel == channel]
    rfig = "no reply" if not replies else f"{replies[0].msg_type} status {replies[0].content.get('status')!r}"
    fig = f"busy/idle {'yes' if bracket else 'no'}; {rfig}; the kernel served on"
    if replies and replies[0].content.get("status") != "error":
        return failed(fig + " (a reply to an unknown request must say error)")
    return verdict(bracket, fig)


def _unknown_check(channel: str) -> None:
    """Register ``bad_input.unknown_<channel>`` (:func:`_unknown` on ``channel``)."""

    def run(ctx: Ctx) -> Verdict:
        return _unknown(ctx, channel)

    run.__name__ = run.__qualname__ = f"unknown_{channel}"
    check(
        f"bad_input.unknown_{channel}",
        S["status"] + " (every request, since 5.0); messaging § Compatibility",
        f"an unknown {UNKNOWN!r} on {channel} gets busy/idle (a reply, if any, status error); the kernel serves on",
    )(run)


_unknown_check("shell")
_unknown_check("control")


@check("bad_input.stdin", S["input_reply"])
def unknown_stdin(ctx: Ctx) -> Verdict:
    """an unknown message and an input_reply that answers nothing, on stdin, are ignored; the kernel serves on"""
    ch = ctx.ch
    a = ch.send("stdin", UNKNOWN, {})
    b = ch.send("stdin", "input_reply", {"value": "conformance stray"})
    _fence(ctx)
    # the fence orders shell only: stdin has no request to fence it with, so
    # a stray answer there gets half a second more (a loaded machine was late)
    ch.pump(0.5)
    answers = _answered(ctx, a["msg_id"]) + _answered(ctx, b["msg_id"])
    shell_ok = ctx.k.alive()
    return verdict(
        shell_ok and not [m for m in answers if m.channel == "stdin"],
        f"{len(answers)} messages in answer; the kernel served on",
    )


# -- heartbeat ---------------------------------------------------------------------


@check("heartbeat.echo", "messaging § Heartbeat for kernels")
def heartbeat_echo(ctx: Ctx) -> Verdict:
    """a heartbeat ping is echoed byte for byte within 1 s"""
    rtts = [ctx.ch.ping(1.0) for _ in range(3)]
    if any(r is None for r in rtts):
        return failed(f"{sum(r is None for r in rtts)} of 3 pings not echoed within 1 s")
    return passed(f"3 of 3 echoed, max {max(r for r in rtts if r is not None) * 1000:.1f} ms")


@check("heartbeat.busy", "messaging § Heartbeat for kernels (kernels § Handling messages)")
def heartbeat_busy(ctx: Ctx) -> Verdict:
    """pings are echoed within 1 s while a cell keeps the CPU busy"""
    ch = ctx.ch
    h = ch.execute(ctx.code.busy(2.0))
    ch.wait(
        lambda: next((m for m in ch.for_parent(h["msg_id"], socket="iopub") if m.msg_type == "execute_input"), None),
        ctx.t.reply,
        "the cell's execute_input",
    )
    rtts = []
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        rtts.append(ch.ping(1.0))
        time.sleep(0.05)  # a ping every 50 ms: how fast the heartbeat can go is not under test
    reply = ch.reply(h, ctx.t.reply)
    missed = sum(r is None for r in rtts)
    still_busy = not any(is_idle(m) for m in ch.for_parent(h["msg_id"], socket="iopub") if m.arrival < end)
    worst = max((r for r in rtts if r is not None), default=0.0)
    fig = (
        f"{len(rtts) - missed} of {len(rtts)} pings echoed during the busy cell "
        f"(max {worst * 1000:.1f} ms); cell {reply.content.get('status')}"
    )
    return verdict(missed == 0 and still_busy, fig)
