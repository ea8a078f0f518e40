"""What ``get_ipython().kernel`` offers user code.

Libraries written for ipykernel reach for a few things on the shell's
``kernel`` attribute (ipykernel's ``Kernel``); trikernel gives them exactly
those, on a small object, not the kernel itself (docs/compatibility.md
lists who uses what):

- ``get_parent(channel="shell")``: the request whose code is running *in
  this context* — the ``execute_request`` inside a cell (and in the threads
  and trio tasks it started), the ``comm_msg`` inside a widget callback — as
  a jupyter_client message dict; ``"control"``: the latest request read on
  control. ipywidgets' ``Output`` reads ``["header"]["msg_id"]`` from it and
  syncs that ``msg_id`` so the frontend routes the block's output into the
  widget. ``set_parent(ident, parent, channel)``: output of this context goes
  to ``parent`` from now on (jupyter_dash). ``_parent_header``: ipywidgets'
  fallback for ipykernel < 6.
- ``session``: a :class:`KernelSession` whose ``send(stream, msg_or_type,
  content, parent, ident, buffers, ...)`` and ``msg(...)`` are
  jupyter_client's ``Session`` methods for IOPub, sent through the kernel's
  IOPub queue (its backpressure, never a socket of user code's);
  ``iopub_socket``, the token ``send`` takes for IOPub; ``send_response``
  (ipywidgets' fallback). ``str(kernel.session)`` is the session id.
- ``comm_manager`` (pyviz_comms, bokeh and older ipywidgets register comm
  targets on it), ``shell``, ``execution_count``, ``language_info``,
  ``implementation``, ``implementation_version``, ``protocol_version``,
  ``banner``, ``log``, ``profile_dir`` and ``_parent_ident``.

Not offered: ``do_one_iteration``, ``shell_handlers``, ``execute_request``,
``io_loop``, ``shell_streams``: the kernel's sockets and event loop, which
user code cannot drive in trikernel (the io run owns them). They raise an
AttributeError that names the attribute and says so.

Runs on: any thread (``get_parent`` reads the running request of the
caller's context; ``session.send`` queues from any thread but the io
thread); :class:`KernelHandle` is built on the main thread at set-up.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

from trikernel import __version__
from trikernel.protocol.messages import iopub_topic, kernel_info_content
from trikernel.protocol.wire import Message, new_header

if TYPE_CHECKING:
    from collections.abc import Mapping

    from trikernel.user.outstream import ParentTracker, Publisher

_Opt: TypeAlias = "dict[str, Any] | None"
_Parent: TypeAlias = "Mapping[str, Any] | None"
_Msg: TypeAlias = "dict[str, Any]"

#: ipykernel's kernel attributes user code cannot have in trikernel (module docstring).
NOT_OFFERED = frozenset({"do_one_iteration", "shell_handlers", "execute_request", "io_loop", "shell_streams"})


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


def extract_header(parent: Mapping[str, Any] | None) -> dict[str, Any]:
    """jupyter_client's ``extract_header``: the header of a message dict, or
    the dict itself when it is a header; ``{}`` for None."""
    if not parent:
        return {}
    header = parent.get("header", parent)
    return dict(header) if isinstance(header, dict) else {}


def as_message(parent: Mapping[str, Any]) -> Message | None:
    """A jupyter_client message dict (or a bare header) as a Message, for
    ``current_request``; None when it has no ``msg_id`` (nothing to parent to)."""
    header = extract_header(parent)
    if not header.get("msg_id"):
        return None
    has_header = isinstance(parent.get("header"), dict)

    def part(name: str) -> dict[str, Any]:
        value = parent.get(name) if has_header else None
        return dict(value) if isinstance(value, dict) else {}

    return Message(header, part("parent_header"), part("metadata"), part("content"))


class IOPubSocket:
    """``get_ipython().kernel.iopub_socket``: not a socket, the token that
    ``kernel.session.send`` takes for "send on IOPub" (ipywidgets#1844's
    pattern passes it). Any thread."""

    def __repr__(self) -> str:
        return "<trikernel IOPub: kernel.session.send(kernel.iopub_socket, ...) queues on it>"


#: The one :class:`IOPubSocket`.
IOPUB = IOPubSocket()


class KernelSession:
    """``get_ipython().kernel.session``: the part of jupyter_client's
    ``Session`` user code calls, for IOPub only. ``session`` is the kernel's
    session id (``str()`` of this object too), ``username`` its header's.

    Messages go through :class:`~trikernel.user.outstream.Publisher`, i.e. the
    IOPub queue: a full queue makes the caller wait (nothing is dropped); the
    output of a silent request is not broadcast, as any output. Any thread
    but the io thread.
    """

    def __init__(self, publisher: Publisher):
        self._publisher = publisher
        self.session: str = publisher.builder.session_id
        self.username: str = publisher.builder.username

    def __str__(self) -> str:
        return self.session

    def __repr__(self) -> str:
        return f"<trikernel session {self.session}>"

    def msg(
        self, msg_type: str, content: _Opt = None, parent: _Parent = None, header: _Opt = None, metadata: _Opt = None
    ) -> _Msg:
        """jupyter_client's ``Session.msg``: a new message dict (``header``,
        ``msg_id``, ``msg_type``, ``parent_header``, ``content``,
        ``metadata``); nothing is sent. ``parent``: a message dict or a
        header."""
        h = header or new_header(msg_type, self.session, self.username)
        return {
            "header": h,
            "msg_id": h["msg_id"],
            "msg_type": h.get("msg_type", msg_type),
            "parent_header": extract_header(parent),
            "content": {} if content is None else content,
            "metadata": dict(metadata or {}),
        }

    def send(
        self,
        stream: Any,
        msg_or_type: dict[str, Any] | str,
        content: dict[str, Any] | None = None,
        parent: Mapping[str, Any] | None = None,
        ident: bytes | str | list[bytes | str] | None = None,
        buffers: list[Any] | None = None,
        track: bool = False,
        header: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """jupyter_client's ``Session.send`` on IOPub: ``msg_or_type`` is a
        message dict (sent with its own header) or a msg_type (a new message
        of ``content``, ``header``, ``metadata``); ``parent`` its parent (a
        message dict or header; none: no parent, as in ipykernel); ``ident``
        the topic (default ``kernel.<pid>.<msg_type>``); ``buffers`` binary
        buffers; ``track`` is ignored. Blocks while the IOPub queue is full.

        Returns:
            The message dict sent; None when it was dropped (a silent
            request's output, a forked child, the kernel shutting down).

        Raises:
            ValueError: ``stream`` is not ``kernel.iopub_socket`` (replies on
                shell and control are the kernel's own).
        """
        if stream is not IOPUB:
            raise ValueError(
                f"trikernel: kernel.session.send sends on kernel.iopub_socket only, not on {stream!r}; "
                "replies on shell and control are the kernel's"
            )
        d = msg_or_type if isinstance(msg_or_type, dict) else self.msg(msg_or_type, content, parent, header, metadata)
        msg_type = str(d["header"]["msg_type"])
        topics = ident if isinstance(ident, list) else [ident] if ident is not None else [iopub_topic(msg_type)]
        msg = Message(
            dict(d["header"]),
            extract_header(d.get("parent_header")),
            dict(d.get("metadata") or {}),
            d.get("content") or {},
            tuple(bytes(b) for b in buffers or ()),
            tuple(t.encode() if isinstance(t, str) else bytes(t) for t in topics),
        )
        if not self._publisher.send_message(msg):
            return None
        return {**d, "msg_id": msg.msg_id, "msg_type": msg_type, "buffers": list(msg.buffers)}


class KernelHandle:
    """``get_ipython().kernel`` in trikernel (see the module docstring).

    ``parents``: where the running request is found; ``publisher``: the
    IOPub publisher (``session.send``); ``comm_manager``: the ``comm``
    package's manager; ``shell``: the IPython shell.
    """

    implementation = "trikernel"
    implementation_version = __version__

    def __init__(self, parents: ParentTracker, publisher: Publisher, *, comm_manager: Any, shell: Any):
        self._parents = parents
        self.comm_manager = comm_manager
        self.shell = shell
        self.session = KernelSession(publisher)
        self.iopub_socket = IOPUB
        self.log = logging.getLogger("trikernel.user")
        info = kernel_info_content()
        self.language_info: dict[str, Any] = info["language_info"]
        self.protocol_version: str = info["protocol_version"]

    @property
    def banner(self) -> str:
        """IPython's banner, ``shell.banner``, as ipykernel's property (with the
        shell's profile, ``banner2`` and tip; ``kernel_info_reply``'s has no tip)."""
        return str(self.shell.banner)

    @property
    def execution_count(self) -> int:
        """The shell's execution count (the running cell's lane), as ipykernel's property."""
        return int(self.shell.execution_count)

    @property
    def profile_dir(self) -> Any:
        """The shell's IPython ``ProfileDir``."""
        return self.shell.profile_dir

    def get_parent(self, channel: str | None = "shell") -> dict[str, Any]:
        """The request whose code runs in this context, as a message dict
        (else the latest execute request); ``{}`` before the first request.
        ``channel="control"``: the latest request read on control (none of
        them runs user code in trikernel). ipykernel's ``Kernel.get_parent``."""
        msg = self._parents.latest_control if channel == "control" else self._parents.request()
        return message_dict(msg) if msg is not None else {}

    def set_parent(self, ident: Any, parent: Mapping[str, Any], channel: str = "shell") -> None:
        """ipykernel's ``Kernel.set_parent``: output of this context (thread,
        trio task) is parented to ``parent`` from now on (a message dict).
        ``ident`` and ``channel`` are accepted and not needed (replies are the
        kernel's own)."""
        del ident, channel
        msg = as_message(parent)
        if msg is not None:
            self._parents.set_current(msg)

    def send_response(
        self,
        stream: Any,
        msg_or_type: dict[str, Any] | str,
        content: dict[str, Any] | None = None,
        ident: Any = None,
        buffers: list[Any] | None = None,
        track: bool = False,
        header: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        channel: str = "shell",
    ) -> dict[str, Any] | None:
        """ipykernel's ``Kernel.send_response``: :meth:`KernelSession.send` with
        the running request (of ``channel``) as the parent. Raises ValueError
        for a ``stream`` other than ``iopub_socket``."""
        parent = self.get_parent(channel)
        return self.session.send(stream, msg_or_type, content, parent, ident, buffers, track, header, metadata)

    @property
    def _parent_header(self) -> dict[str, Any]:
        """ipykernel < 6's name for the parent request (what ipywidgets falls back to)."""
        return self.get_parent()

    @property
    def _parent_ident(self) -> Mapping[str, Any]:
        """Routing identities of the running request per channel (ipykernel's shape)."""
        msg = self._parents.request()
        control = self._parents.latest_control
        return {
            "shell": list(msg.identities) if msg is not None else [],
            "control": list(control.identities) if control is not None else [],
        }

    def __getattr__(self, name: str) -> NoReturn:
        if name in NOT_OFFERED:
            raise AttributeError(
                f"get_ipython().kernel has no {name!r} in trikernel: the kernel's sockets and event loop "
                "are not user code's to drive (docs/compatibility.md)"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"<trikernel {__version__} kernel (get_ipython().kernel)>"
