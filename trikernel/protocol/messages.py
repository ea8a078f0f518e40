"""Message builders for the kernel side of the protocol (spec 5.5).

:class:`MessageBuilder` stamps headers (one session id per kernel process)
and builds replies, status and IOPub messages with the right parent header.
Pure: no sockets.

Runs on: any thread (pure: :class:`MessageBuilder` holds no mutable
state, so every producer thread shares one).
"""

from __future__ import annotations

import copy
import functools
import os
import sys
from typing import Any

from trikernel.protocol.wire import PROTOCOL_VERSION, Message, new_header

IMPLEMENTATION = "trikernel"


@functools.cache
def iopub_topic(msg_type: str) -> bytes:
    """The IOPub topic frame, ``kernel.<pid>.<msg_type>`` like ipykernel (cached)."""
    return f"kernel.{os.getpid()}.{msg_type}".encode()


class MessageBuilder:
    """Builds the kernel's messages, stamped with its session id (spec
    "General Message Format": ``header.session`` is the same for every
    message one kernel process sends).

    Not jupyter_client's ``Session``: this one neither signs nor sends
    (wire.py signs). Thread-safe: it holds no mutable state.

    ``session_id``: 32 hex digits, random per process unless given.
    """

    def __init__(self, session_id: str | None = None, username: str = "kernel"):
        self.session_id = session_id or os.urandom(16).hex()
        self.username = username

    def msg(
        self,
        msg_type: str,
        content: dict[str, Any],
        parent_header: dict[str, Any] | None = None,
        *,
        metadata: dict[str, Any] | None = None,
        buffers: tuple[bytes, ...] = (),
        identities: tuple[bytes, ...] = (),
    ) -> Message:
        """A new message; ``parent_header`` is copied (``{}`` when None)."""
        return Message(
            new_header(msg_type, self.session_id, self.username),
            dict(parent_header) if parent_header else {},
            metadata or {},
            content,
            buffers,
            identities,
        )

    def reply(self, request: Message, content: dict[str, Any], *, metadata: dict[str, Any] | None = None) -> Message:
        """``<x>_reply`` to a ``<x>_request``, routed back to its sender."""
        msg_type = reply_type(request.msg_type)
        return self.msg(msg_type, content, request.header, metadata=metadata, identities=request.identities)

    def iopub(self, msg_type: str, content: dict[str, Any], parent_header: dict[str, Any] | None, **kw: Any) -> Message:
        """An IOPub message with the ``kernel.<pid>.<msg_type>`` topic."""
        return self.msg(msg_type, content, parent_header, identities=(iopub_topic(msg_type),), **kw)

    def status(self, state: str, parent_header: dict[str, Any] | None) -> Message:
        """IOPub ``status`` with ``execution_state`` busy/idle/starting (spec "Kernel status")."""
        return self.iopub("status", {"execution_state": state}, parent_header)


def reply_type(request_type: str) -> str:
    """``"execute_request"`` → ``"execute_reply"``; a name without the
    ``_request`` suffix gets ``_reply`` appended (``"foo"`` → ``"foo_reply"``)."""
    base = request_type[: -len("_request")] if request_type.endswith("_request") else request_type
    return base + "_reply"


def language_info() -> dict[str, Any]:
    """``kernel_info_reply``'s ``language_info`` (messaging spec "Kernel info"): Python, the
    running interpreter's version, the ``ipython`` CodeMirror mode (version 3) and pygments
    lexer, ``.py`` files. A fresh dict each call."""
    v = sys.version_info
    return {
        "name": "python",
        "version": f"{v.major}.{v.minor}.{v.micro}",
        "mimetype": "text/x-python",
        "codemirror_mode": {"name": "ipython", "version": 3},
        "pygments_lexer": "ipython3",
        "nbconvert_exporter": "python",
        "file_extension": ".py",
    }


def ipython_banner(ipython_version: str) -> str:
    """IPython's default banner (``IPython.core.usage.default_banner``, the
    ``banner`` of ipykernel's ``kernel_info_reply``) for this Python and
    ``ipython_version``, built without importing IPython: three lines, each
    ending in a newline. ipykernel's (``shell.banner``) may add a profile
    line, ``banner2`` and a random "Tip:" line; this one does not."""
    return (
        f"Python {sys.version.splitlines()[0]}\n"
        "Type 'copyright', 'credits' or 'license' for more information\n"
        f"IPython {ipython_version} -- An enhanced Interactive Python. Type '?' for help.\n"
    )


@functools.cache
def _static_kernel_info(debugger: bool, ipython_version: str) -> dict[str, Any]:
    from trikernel import __version__

    return {
        "status": "ok",
        "protocol_version": PROTOCOL_VERSION,
        "implementation": IMPLEMENTATION,
        "implementation_version": __version__,
        "language_info": language_info(),
        "banner": ipython_banner(ipython_version),
        "help_links": [
            {"text": "Python Reference", "url": "https://docs.python.org/3/"},
            {"text": "IPython Reference", "url": "https://ipython.readthedocs.io/"},
            {"text": "trio", "url": "https://trio.readthedocs.io/"},
        ],
        # deprecated boolean, and JEP 92's feature name; only where debugpy is installed
        "debugger": debugger,
        "supported_features": ["kernel subshells", *(["debugger"] if debugger else [])],
    }


def kernel_info_content(*, debugger: bool = False, ipython_version: str = "") -> dict[str, Any]:
    """``kernel_info_reply`` content (spec "Kernel info"; JEP 92's
    ``supported_features``).

    Args:
        debugger: the kernel offers the debugger (debugpy can be imported:
            ``trikernel.debug.debugger.available()``, which the caller asks,
            since this module is pure).
        ipython_version: for the ``banner``, IPython's default one as
            ipykernel gives (:func:`ipython_banner`); the caller finds it
            (launch/kernel.py ``ipython_version``).

    Returns:
        A fresh dict each time (callers may mutate it). Static: it needs no
        IPython, so the io thread answers it while IPython is still loading.
    """
    return copy.deepcopy(_static_kernel_info(debugger, ipython_version))
