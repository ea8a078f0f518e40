"""Message builders for the kernel side of the protocol (spec 5.5).

:class:`Session` stamps headers (one session id per kernel process) and
builds replies, status and IOPub messages with the right parent. Pure: no
sockets.
"""

from __future__ import annotations

import copy
import functools
import os
import sys
from typing import Any

from .wire import PROTOCOL_VERSION, Message, new_header

IMPLEMENTATION = "trikernel"


@functools.cache
def iopub_topic(msg_type: str) -> bytes:
    """The IOPub topic frame, ``kernel.<pid>.<msg_type>`` like ipykernel (cached)."""
    return f"kernel.{os.getpid()}.{msg_type}".encode()


class Session:
    """Builds messages stamped with this kernel's session id."""

    def __init__(self, session_id: str | None = None, username: str = "kernel"):
        self.session = session_id or os.urandom(16).hex()
        self.username = username

    def msg(
        self,
        msg_type: str,
        content: dict[str, Any],
        parent: Message | dict[str, Any] | None = None,
        *,
        metadata: dict[str, Any] | None = None,
        buffers: tuple[bytes, ...] = (),
        identities: tuple[bytes, ...] = (),
    ) -> Message:
        parent_header = parent.header if isinstance(parent, Message) else (parent or {})
        return Message(
            new_header(msg_type, self.session, self.username),
            dict(parent_header),
            metadata or {},
            content,
            buffers,
            identities,
        )

    def reply(self, parent: Message, content: dict[str, Any], *, metadata: dict[str, Any] | None = None) -> Message:
        """``<x>_reply`` to a ``<x>_request``, routed back to the sender."""
        msg_type = parent.msg_type.rsplit("_", 1)[0] + "_reply"
        return self.msg(msg_type, content, parent, metadata=metadata, identities=parent.identities)

    def iopub(
        self, msg_type: str, content: dict[str, Any], parent: Message | dict[str, Any] | None, **kw: Any
    ) -> Message:
        return self.msg(msg_type, content, parent, identities=(iopub_topic(msg_type),), **kw)

    def status(self, state: str, parent: Message | dict[str, Any] | None) -> Message:
        """IOPub ``status`` with ``execution_state`` busy/idle/starting."""
        return self.iopub("status", {"execution_state": state}, parent)


def language_info() -> dict[str, Any]:
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


@functools.cache
def _static_kernel_info() -> dict[str, Any]:
    from . import __version__

    return {
        "status": "ok",
        "protocol_version": PROTOCOL_VERSION,
        "implementation": IMPLEMENTATION,
        "implementation_version": __version__,
        "language_info": language_info(),
        "banner": f"trikernel {__version__}: IPython on trio, Python {sys.version.split()[0]}",
        "help_links": [
            {"text": "Python Reference", "url": "https://docs.python.org/3/"},
            {"text": "IPython Reference", "url": "https://ipython.readthedocs.io/"},
            {"text": "trio", "url": "https://trio.readthedocs.io/"},
        ],
        "debugger": False,
        "supported_features": [],
    }


def kernel_info_content() -> dict[str, Any]:
    """``kernel_info_reply`` content (spec "Kernel info").

    Static: it needs no IPython, so the io thread answers it while IPython
    is still loading. A fresh copy each time (callers may not mutate ours).
    """
    return copy.deepcopy(_static_kernel_info())
