"""Debug Adapter Protocol messages the kernel builds itself (pure).

The DAP ("Base Protocol": ``Response``) as carried by ``debug_request`` /
``debug_reply`` (messaging spec "Debug request"). The core answers a
``debug_request`` with one of these when the kernel has no debugger; the
debugger (debug/) for everything it answers itself.

Runs on: any thread (pure).
"""

from __future__ import annotations

from typing import Any


def response(
    request: dict[str, Any], success: bool = True, body: dict[str, Any] | None = None, message: str | None = None
) -> dict[str, Any]:
    """A DAP ``Response`` to ``request``: ``seq`` 0, ``type`` "response",
    ``request_seq`` (the request's ``seq`` if an int, else 0), ``success``,
    ``command`` (the request's, as a string), and ``body`` / ``message``
    when given."""
    seq = request.get("seq")
    out: dict[str, Any] = {
        "seq": 0,
        "type": "response",
        "request_seq": seq if isinstance(seq, int) and not isinstance(seq, bool) else 0,
        "success": success,
        "command": str(request.get("command", "")),
    }
    if body is not None:
        out["body"] = body
    if message is not None:
        out["message"] = message
    return out
