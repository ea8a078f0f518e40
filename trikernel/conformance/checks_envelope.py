"""The every-message checks: one row per audit category, over all the run's traffic.

They run after the shared checks (phase ``audit``) and report what the
:class:`~.audit.Audit` saw on every socket for the whole run, plus a round
of one request of each kind sent here, so that ``--check messages.*`` alone
still sees every common message type.

Spec: messaging "General Message Format", "Message Header", "Parent
header", "The Wire Protocol", and each message type's section.

Runs on: the client side, the suite's thread only (the runner runs each
check to its end, one at a time).
"""

from __future__ import annotations

from trikernel.conformance.audit import SECTIONS
from trikernel.conformance.catalogue import Ctx, check
from trikernel.conformance.verdict import Fail, Verdict, verdict


def _traffic(ctx: Ctx) -> None:
    """One request of each common kind (once per run), so every category has material."""
    if ctx.notes.get("traffic_done") or not ctx.k.alive():
        return
    ctx.notes["traffic_done"] = True
    ch = ctx.ch
    try:
        ch.request("shell", "kernel_info_request", {}, ctx.t.reply)
        ch.request("control", "kernel_info_request", {}, ctx.t.reply)
        ch.request("shell", "comm_info_request", {}, ctx.t.reply)
        if ctx.has_code:
            code = ctx.code
            ch.run(code.say("conformance audit") + "\n" + code.result, ctx.t.reply)
            ch.run(code.error, ctx.t.reply, stop_on_error=False)
            ch.run(code.update_display("a", "b"), ctx.t.reply)
            ch.request("shell", "complete_request", {"code": "pri", "cursor_pos": 3}, ctx.t.reply)
            ch.request(
                "shell",
                "inspect_request",
                {"code": code.inspect_found, "cursor_pos": 2, "detail_level": 0},
                ctx.t.reply,
            )
            ch.request("shell", "is_complete_request", {"code": code.incomplete_code}, ctx.t.reply)
            ch.request(
                "shell",
                "history_request",
                {"output": True, "raw": True, "hist_access_type": "tail", "n": 3},
                ctx.t.reply,
            )
    except Fail:
        pass  # whatever did arrive is audited; the failure itself is another check's row


def _report(ctx: Ctx, category: str, what: str) -> Verdict:
    _traffic(ctx)
    t = ctx.k.audit.tallies[category]
    if t.checked == 0:
        return verdict(False, "no messages were received")
    if t.bad == 0:
        return verdict(True, f"{t.checked:,} {what}, 0 departures")
    return verdict(False, f"{t.bad:,} of {t.checked:,} {what} depart; e.g. " + " | ".join(t.examples))


def _audit_check(category: str, summary: str, what: str = "messages") -> None:
    """Register ``messages.<category>``: what the audit's tally of
    ``category`` (``audit.SECTIONS``) found over ``what``."""

    def run(ctx: Ctx) -> Verdict:
        return _report(ctx, category, what)

    run.__name__ = run.__qualname__ = f"messages_{category}"
    check(f"messages.{category}", SECTIONS[category], summary, phase="audit")(run)


# one row per audit category, in this order
_audit_check(
    "header", "every message parses: four JSON objects; header msg_id, msg_type, session, username are strings"
)
_audit_check("msg_id", "no msg_id is used twice")
_audit_check("date", "every header date is an ISO 8601 timestamp")
_audit_check("version", "every header version is a 5.x protocol version")
_audit_check("signature", "every message is signed with the connection key (HMAC of the four frames)")
_audit_check("content", "every content matches its msg_type's schema, on its channel; no deprecated forms")
_audit_check(
    "parent",
    "every reply (and input_request) has its request's header as parent_header and the matching *_reply type",
    what="replies",
)
