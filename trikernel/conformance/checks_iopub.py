"""Checks of IOPub: the welcome message (JEP 65) and delivery under load.

- ``iopub.welcome``: the suite's first subscriber gets an ``iopub_welcome``
  with no parent and its subscription (``""``), without sending anything;
- ``iopub.two_subscribers``: two SUBs that connect at the same moment each
  get a welcome, then the same messages of the next request;
- ``iopub.late_joiner``: a SUB that connects while a cell prints gets a
  welcome and, from there on, exactly the tail of what the first
  subscriber got, idle included;
- ``iopub.flood``: 200,000 prints arrive complete and in order;
- ``iopub.slow_subscriber``: a subscriber that stops reading for 2 s while
  4,000 display messages of ~4 KB are produced (its receive buffer kept
  small) loses none of them (beyond the spec: the figure is what it lost).

Spec: messaging "Messages on the IOPub (XPUB/SUB) channel", "Welcome
message"; JEP 65.

Runs on: the client side, the suite's thread only (every subscriber is a
SUB socket read from that thread by ``Channels.pump``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import zmq

from trikernel.conformance.catalogue import Ctx, check
from trikernel.conformance.client import is_idle
from trikernel.conformance.verdict import Fail, Verdict, failed, verdict
from trikernel.protocol import msgspec

if TYPE_CHECKING:
    from trikernel.conformance.received import Received

S = msgspec.SECTIONS
SEC_IOPUB = "messaging § Messages on the IOPub (XPUB/SUB) channel"
FLOOD_LINES = 200_000
SLOW_MESSAGES = 4_000
SLOW_WIDTH = 4_000
SLOW_PAUSE = 2.0
#: Seconds of a flood after which a too slow rate fails it early.
PROJECT_AFTER = 10.0


def _welcomes(ctx: Ctx, label: str) -> list[Received]:
    return [m for m in ctx.ch.orphans.get(label, []) if m.msg_type == "iopub_welcome"]


def _first_welcome(ctx: Ctx, label: str) -> Received | None:
    found = _welcomes(ctx, label)
    return found[0] if found else None


def _subscribe(ctx: Ctx, labels: tuple[str, ...], **kw: Any) -> dict[str, float | None]:
    """Connect SUBs ``labels`` together and wait until each is subscribed.

    Returns, per label, the seconds until its first iopub_welcome, or None if
    it got none: a SUB that receives other traffic (kernel_info requests on
    control nudge the kernel every 0.25 s) and no welcome within 0.5 s of it
    is subscribed but was not welcomed. Fail if a SUB gets nothing at all
    within ``Deadlines.welcome``.
    """
    ch = ctx.ch
    t0 = time.monotonic()
    for label in labels:
        ch.subscribe(label, **kw)
    out: dict[str, float | None] = {}
    first_seen: dict[str, float] = {}
    last_nudge = 0.0
    while len(out) < len(labels):
        now = time.monotonic()
        for label in labels:
            if label in out:
                continue
            w = _welcomes(ctx, label)
            if w:
                out[label] = w[0].arrival - t0
            elif ch.received.get(label):
                first_seen.setdefault(label, now)
                if now - first_seen[label] > 0.5:
                    out[label] = None
        if len(out) == len(labels):
            break
        if now - t0 > ctx.t.welcome:
            missing = [label for label in labels if label not in out]
            raise Fail(f"{', '.join(missing)}: no message at all within {ctx.t.welcome:g} s of connecting")
        if now - last_nudge > 0.25:
            ch.send("control", "kernel_info_request", {})
            last_nudge = now
        ch.pump(0.02)
    return out


def _welcome_text(label: str, dt: float | None) -> str:
    return f"{label}: welcome after {dt * 1000:.0f} ms" if dt is not None else f"{label}: no welcome"


@check("iopub.welcome", S["iopub_welcome"])
def iopub_welcome(ctx: Ctx) -> Verdict:
    """the first subscriber gets iopub_welcome (subscription '', empty parent) unprompted"""
    since = ctx.k.connected_at
    try:
        w = ctx.ch.wait(
            lambda: _first_welcome(ctx, "iopub"),
            max(0.0, since + ctx.t.welcome - time.monotonic()),
            "welcome",
        )
    except Fail:
        return failed(
            f"no iopub_welcome within {ctx.t.welcome:g} s of connecting "
            f"({ctx.ch.received.get('iopub', 0)} other messages arrived)"
        )
    sub = w.content.get("subscription")
    parent = w.as_dict()["parent_header"]
    fig = f"welcome after {(w.arrival - since) * 1000:.0f} ms, subscription {sub!r}, parent_header {parent!r}"
    return verdict(sub == "" and parent == {}, fig)


@check("iopub.two_subscribers", S["iopub_welcome"] + "; " + SEC_IOPUB)
def iopub_two_subscribers(ctx: Ctx) -> Verdict:
    """two subscribers connecting together both get a welcome, then the same messages"""
    ch = ctx.ch
    labels = ("iopub:a", "iopub:b")
    try:
        waits = _subscribe(ctx, labels)
        h = ch.execute(ctx.code.say("conformance two"))
        ch.reply(h, ctx.t.reply)
        seqs = [[m.msg_id for m in ch.until_idle(h, ctx.t.reply, socket=label)] for label in ("iopub", *labels)]
    finally:
        for label in labels:
            ch.close_socket(label)
    same = seqs[1] == seqs[0] and seqs[2] == seqs[0]
    fig = (
        "; ".join(_welcome_text(label, waits[label]) for label in labels)
        + f"; then {len(seqs[1])} and {len(seqs[2])} messages of the next request, "
        + f"{'identical' if same else 'different'} to the first subscriber's {len(seqs[0])}"
    )
    return verdict(same and None not in waits.values(), fig)


@check("iopub.late_joiner", S["iopub_welcome"] + "; " + SEC_IOPUB)
def iopub_late_joiner(ctx: Ctx) -> Verdict:
    """a subscriber joining while a cell prints gets a welcome and the exact tail of the cell's messages"""
    ch = ctx.ch
    h = ch.execute(ctx.code.ticker(50, 0.02))
    mid = h["msg_id"]
    ch.wait(
        lambda: sum(m.msg_type == "stream" for m in ch.for_parent(mid, socket="iopub")) >= 5 or None,
        ctx.t.reply,
        "the ticker's first lines",
    )
    try:
        dt = _subscribe(ctx, ("iopub:late",))["iopub:late"]
        ch.reply(h, ctx.t.reply + 2)
        main = [m.msg_id for m in ch.until_idle(h, ctx.t.reply, socket="iopub")]
        late = [m.msg_id for m in ch.until_idle(h, ctx.t.reply, socket="iopub:late")]
    finally:
        ch.close_socket("iopub:late")
    if not late or late[0] not in main:
        return failed(f"the late subscriber's messages ({len(late)}) do not start inside the first subscriber's")
    start = main.index(late[0])
    tail = main[start:] == late
    fig = (
        _welcome_text("late subscriber", dt)
        + f" while the cell ran; then messages {start + 1}..{len(main)} of {len(main)}"
    )
    return verdict(tail and dt is not None, fig + ("" if tail else ", with gaps"))


@check(
    "iopub.flood", SEC_IOPUB + " (no message lost)", f"{FLOOD_LINES:,} prints arrive complete and in order before idle"
)
def iopub_flood(ctx: Ctx) -> Verdict:
    """Check ``iopub.flood`` (messaging spec "Messages on the IOPub (XPUB/SUB) channel"): one
    cell prints :data:`FLOOD_LINES` numbered lines; PASS when stdout arrives complete and in
    order before idle, within ``Deadlines.flood`` seconds. Fails early, after
    :data:`PROJECT_AFTER` seconds, when the rate seen so far cannot finish within the
    deadline."""
    ch = ctx.ch
    pieces: list[str] = []
    count = [0, 0]  # messages, lines

    def sink(m: Received) -> bool:
        if m.msg_type == "stream" and m.socket == "iopub":
            if m.content.get("name") == "stdout":
                text = str(m.content.get("text", ""))
                pieces.append(text)
                count[0] += 1
                count[1] += text.count("\n")
            return True
        return False

    t0 = time.monotonic()
    h = ch.execute(ctx.code.flood(FLOOD_LINES))
    ch.sinks[h["msg_id"]] = sink

    def done() -> bool | None:
        if any(is_idle(m) for m in ch.for_parent(h["msg_id"], socket="iopub")):
            return True
        spent = time.monotonic() - t0
        if spent > PROJECT_AFTER and count[1] * ctx.t.flood < FLOOD_LINES * spent:
            rate = count[1] / spent
            raise Fail(
                f"{count[1]:,} of {FLOOD_LINES:,} lines after {spent:.0f} s: at {rate:,.0f} lines/s "
                f"the output would take {FLOOD_LINES / max(rate, 1):,.0f} s, past the {ctx.t.flood:g} s deadline"
            )
        return None

    try:
        ch.wait(done, ctx.t.flood, "the flood's idle")
    except Fail as exc:
        lines = "".join(pieces).count("\n")
        ctx.k.settle(ctx.code.noop)
        raise Fail(f"{exc} ({lines:,} lines had arrived)") from None
    finally:
        ch.sinks.pop(h["msg_id"], None)
    dt = time.monotonic() - t0
    text = "".join(pieces)
    expected = "".join(f"{i}\n" for i in range(FLOOD_LINES))
    if text == expected:
        return verdict(
            True, f"{FLOOD_LINES:,} of {FLOOD_LINES:,} lines in order, {count[0]:,} stream messages, {dt:.1f} s"
        )
    got = text.splitlines()
    first_bad = next((i for i, line in enumerate(got) if line != str(i)), len(got))
    return failed(
        f"{len(got):,} of {FLOOD_LINES:,} lines; first departure at line {first_bad:,} "
        f"({count[0]:,} messages, {dt:.1f} s)"
    )


def _slow_value(m: Received) -> int | None:
    text = (m.content.get("data") or {}).get("text/plain", "")
    try:
        return int(str(text).strip("'\"").lstrip("x") or "-1")
    except ValueError:
        return None


@check(
    "iopub.slow_subscriber",
    SEC_IOPUB + " (beyond the spec: lossless delivery)",
    f"a subscriber that stops reading for {SLOW_PAUSE:g} s during {SLOW_MESSAGES:,} display messages loses none",
)
def iopub_slow_subscriber(ctx: Ctx) -> Verdict:
    """Check ``iopub.slow_subscriber`` (beyond the spec: lossless delivery): a second SUB (RCVHWM
    100, a 64 KiB receive buffer) stops reading for :data:`SLOW_PAUSE` seconds while a cell
    displays :data:`SLOW_MESSAGES` messages of about :data:`SLOW_WIDTH` bytes; PASS when both
    subscribers get every one, in order. The figure is how many the slow one lost."""
    ch = ctx.ch
    label = "iopub:slow"
    got: dict[str, list[int | None]] = {"iopub": [], label: []}
    try:
        _subscribe(ctx, (label,), rcvhwm=100)
        ch.sockets[label].setsockopt(zmq.RCVBUF, 65536)
        ch.unregister(label)  # from here on it reads only when told to

        def sink(m: Received) -> bool:
            if m.msg_type == "display_data":
                got.setdefault(m.socket, []).append(_slow_value(m))
                return True
            return False

        t0 = time.monotonic()
        h = ch.execute(ctx.code.padded_displays(SLOW_MESSAGES, SLOW_WIDTH))
        ch.sinks[h["msg_id"]] = sink
        pause_end = t0 + SLOW_PAUSE
        while time.monotonic() < pause_end:  # the slow subscriber does not read
            ch.pump(min(0.05, max(0.0, pause_end - time.monotonic())))

        # then both read as fast as they can, until each has its idle (or, on a
        # kernel that drops, nothing more has come for a second)
        last = {label: [0, time.monotonic()], "iopub": [0, time.monotonic()]}

        def done(sock: str) -> bool:
            if any(is_idle(m) for m in ch.for_parent(h["msg_id"], socket=sock)):
                return True
            now, n = time.monotonic(), ch.received.get(sock, 0)
            if n != last[sock][0]:
                last[sock] = [n, now]
            return now - last[sock][1] > 1.0

        def both_done() -> bool | None:
            ch.drain(label, limit=200)
            replied = any(m.channel == "shell" for m in ch.for_parent(h["msg_id"]))
            return (replied and done("iopub") and done(label)) or None

        ch.wait(both_done, ctx.t.flood, "the reply and both subscribers' idle")
        dt = time.monotonic() - t0
    finally:
        ch.sinks.clear()
        ch.close_socket(label)
    want = list(range(SLOW_MESSAGES))
    fast, slowv = got["iopub"], got[label]
    fig = (
        f"slow subscriber: {len(slowv):,} of {SLOW_MESSAGES:,} ({SLOW_MESSAGES - len(slowv):,} lost); "
        f"reading subscriber: {len(fast):,}; {dt:.1f} s"
    )
    order = "" if slowv == want or len(slowv) != SLOW_MESSAGES else ", out of order"
    return verdict(slowv == want and fast == want, fig + order)
