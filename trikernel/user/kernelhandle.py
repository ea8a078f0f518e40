"""What ``get_ipython().kernel`` offers user code.

Libraries written for ipykernel reach for a few things on the shell's
``kernel`` attribute (ipykernel's ``Kernel``); trikernel gives them exactly
those, on a small object, not the kernel itself:

- ``get_parent(channel=None)``: the request whose code is running *in this
  context* — the ``execute_request`` inside a cell (and in the threads and
  trio tasks it started), the ``comm_msg`` inside a widget callback — as a
  jupyter_client message dict. ipywidgets' ``Output`` reads
  ``["header"]["msg_id"]`` from it and syncs that ``msg_id`` so the frontend
  routes the block's output into the widget (``with out:``,
  ``@out.capture()``, ``interact``, ``interactive_output``). ipykernel >= 6.
- ``_parent_header``: the same message (ipywidgets' fallback for
  ipykernel < 6, where it was the parent request).
- ``comm_manager`` (pyviz_comms, bokeh and older ipywidgets register comm
  targets on it), ``shell``, ``session`` (the session id, not a socket),
  ``language_info``, ``implementation``, ``implementation_version``,
  ``protocol_version``, ``banner`` (IPython's ``%notebook`` reads
  ``language_info``), and ``_parent_ident`` (routing identities per channel).

Not offered: ``iopub_socket``, ``send_response``, ``do_one_iteration`` and
the other handles on ipykernel's sockets and event loop; code that needs
them reports an AttributeError naming the attribute.

Threads: any thread may call it; the request comes from
``outstream.current_request`` (set per request on the main thread,
inherited by trio tasks and threads), else the latest execute request.

Runs on: any thread (``get_parent`` reads the running request of the
caller's context); :class:`KernelHandle` is built on the main thread at
set-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trikernel import __version__
from trikernel.protocol.messages import kernel_info_content

if TYPE_CHECKING:
    from collections.abc import Mapping

    from trikernel.protocol.wire import Message
    from trikernel.user.outstream import ParentTracker


def message_dict(msg: Message) -> dict[str, Any]:
    """``msg`` in jupyter_client's dict shape (``header``, ``parent_header``,
    ``metadata``, ``content``, ``buffers``, ``msg_id``, ``msg_type``)."""
    return {
        "header": msg.header,
        "parent_header": msg.parent_header,
        "metadata": msg.metadata,
        "content": msg.content,
        "buffers": [memoryview(b) for b in msg.buffers],
        "msg_id": msg.msg_id,
        "msg_type": msg.msg_type,
    }


class KernelHandle:
    """``get_ipython().kernel`` in trikernel (see the module docstring).

    ``parents``: where the running request is found; ``comm_manager``: the
    ``comm`` package's manager; ``shell``: the IPython shell; ``session``:
    this kernel's session id.
    """

    implementation = "trikernel"
    implementation_version = __version__

    def __init__(self, parents: ParentTracker, *, comm_manager: Any, shell: Any, session: str):
        self._parents = parents
        self.comm_manager = comm_manager
        self.shell = shell
        self.session = session
        info = kernel_info_content()
        self.language_info: dict[str, Any] = info["language_info"]
        self.protocol_version: str = info["protocol_version"]
        self.banner: str = info.get("banner", "")

    def get_parent(self, channel: str | None = None) -> dict[str, Any]:
        """The request whose code runs in this context, as a message dict; ``{}``
        when there is none (before the first request). ``channel``: ``"shell"``
        or None; ``"control"`` gives ``{}`` (control requests never run user
        code in trikernel). ipykernel's ``Kernel.get_parent`` (>= 6)."""
        if channel == "control":
            return {}
        msg = self._parents.request()
        return message_dict(msg) if msg is not None else {}

    @property
    def _parent_header(self) -> dict[str, Any]:
        """ipykernel < 6's name for the parent request (what ipywidgets falls back to)."""
        return self.get_parent()

    @property
    def _parent_ident(self) -> Mapping[str, Any]:
        """Routing identities of the running request per channel (ipykernel's shape)."""
        msg = self._parents.request()
        ident = list(msg.identities) if msg is not None else []
        return {"shell": ident, "control": []}

    def __repr__(self) -> str:
        return f"<trikernel {__version__} kernel (get_ipython().kernel)>"
