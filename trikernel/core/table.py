"""The dispatch table: every message type the kernel serves (messaging spec 5.5).

One row per ``msg_type`` (routes.py, ``Route``): the channels it is accepted
on, its lane, its handler. kernel_info, shutdown and interrupt are accepted
on shell too (deprecated forms, answered on the channel they came from). A
new message type is one row here and one handler (control.py, requests.py).

Runs on: the io run (read only).
"""

from __future__ import annotations

from trikernel.core import control, requests
from trikernel.core.routes import BOTH, CONTROL, SHELL, Lane, Route

ROUTES: dict[str, Route] = {
    "execute_request": Route(SHELL, Lane.SEQUENTIAL, requests.execute),
    "complete_request": Route(SHELL, Lane.SEQUENTIAL, requests.user_request(lambda i: i.complete)),
    "inspect_request": Route(SHELL, Lane.SEQUENTIAL, requests.user_request(lambda i: i.inspect)),
    "is_complete_request": Route(SHELL, Lane.SEQUENTIAL, requests.user_request(lambda i: i.is_complete)),
    "history_request": Route(SHELL, Lane.SEQUENTIAL, requests.user_request(lambda i: i.history)),
    "comm_open": Route(SHELL, Lane.CONCURRENT, requests.comm),
    "comm_msg": Route(SHELL, Lane.CONCURRENT, requests.comm),
    "comm_close": Route(SHELL, Lane.CONCURRENT, requests.comm),
    "comm_info_request": Route(SHELL, Lane.CONCURRENT, requests.user_request(lambda i: i.comm_info, concurrent=True)),
    "kernel_info_request": Route(BOTH, Lane.IO, control.kernel_info),
    "connect_request": Route(BOTH, Lane.IO, control.connect),
    "shutdown_request": Route(BOTH, Lane.IO, control.shutdown),
    "interrupt_request": Route(BOTH, Lane.IO, control.interrupt),
    "usage_request": Route(CONTROL, Lane.IO, control.usage),
    "create_subshell_request": Route(CONTROL, Lane.IO, control.create_subshell),
    "delete_subshell_request": Route(CONTROL, Lane.IO, control.delete_subshell),
    "list_subshell_request": Route(CONTROL, Lane.IO, control.list_subshell),
    "debug_request": Route(CONTROL, Lane.DEBUG, requests.debug),
}

#: The route of anything not in ROUTES (or a known type on a channel that does not take it).
UNKNOWN = Route(BOTH, Lane.IO, control.unknown)
#: The route of a message ``--strict`` refused (whatever its type): answered at once, not run.
REFUSED = Route(BOTH, Lane.IO, control.refused)


def route_of(channel: str, msg_type: str) -> Route:
    """The route of ``msg_type`` on ``channel``: its row, or :data:`UNKNOWN`."""
    route = ROUTES.get(msg_type)
    if route is None or channel not in route.channels:
        return UNKNOWN
    return route
