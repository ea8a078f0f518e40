"""The shell under ipykernel's name: ``ipykernel.zmqshell.ZMQInteractiveShell``.

Libraries decide whether they run in a notebook from the shell's class, not
from anything the kernel says (docs/compatibility.md has the list): rich
compares the class name with ``ZMQInteractiveShell``; plotly wants that
name *and* ``type(shell).__module__`` starting with ``ipykernel.`` (else it
embeds plotly.js, about 4.9 MB, in every figure); pandas looks for ``zmq``
in the qualified name; loguru checks ``isinstance(shell,
ipykernel.zmqshell.ZMQInteractiveShell)``. So trikernel's shell is this
subclass of :class:`~trikernel.user.shell.TrikernelShell`, named and placed
as ipykernel's: ``__module__`` is ``ipykernel.zmqshell``, and the facade's
``ipykernel.zmqshell`` (user/ipykernel_facade) holds this very class, so the
name resolves (``pickle``, ``isinstance``) inside the kernel.

It adds ipykernel 7's shell API for output routing: ``get_parent``,
``set_parent``, ``set_thread_parent``/``reset_thread_parent`` and
``parent_header``, on trikernel's ``current_request`` (outstream.py).

Runs on: the main thread (created in ``set_up``); the parent methods on any
thread (they act on the caller's context).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trikernel.user.kernelhandle import as_message, message_dict
from trikernel.user.shell import TrikernelShell

if TYPE_CHECKING:
    from collections.abc import Mapping
    from contextvars import Token

    from trikernel.protocol.wire import Message
    from trikernel.user.outstream import ParentTracker


class ZMQInteractiveShell(TrikernelShell):
    """trikernel's shell, under ipykernel's class name and module (see the module docstring)."""

    def _tracker(self) -> ParentTracker:
        tracker: ParentTracker = self.publisher.parents
        return tracker

    def get_parent(self) -> dict[str, Any]:
        """ipykernel 7's ``ZMQInteractiveShell.get_parent``: the request whose
        output this context produces (a message dict; the latest execute
        request outside any request; ``{}`` before the first)."""
        msg = self._tracker().request()
        return message_dict(msg) if msg is not None else {}

    def set_parent(self, parent: Mapping[str, Any]) -> None:
        """ipykernel 7's ``ZMQInteractiveShell.set_parent``: output of this
        context (thread, trio task) goes to ``parent`` (a message dict) from
        now on — the recipe for a background thread whose output belongs to a
        given cell (ipywidgets#4020). A parent without ``msg_id`` is ignored."""
        msg = as_message(parent)
        if msg is not None:
            self._tracker().set_current(msg)

    def set_thread_parent(self, parent: Mapping[str, Any]) -> Token[Message | None] | None:
        """ipykernel 7: :meth:`set_parent` for this thread only; returns the
        token :meth:`reset_thread_parent` takes (None for a parent without
        ``msg_id``). In trikernel every thread has its own context already."""
        msg = as_message(parent)
        return self._tracker().set_current(msg) if msg is not None else None

    def reset_thread_parent(self, token: Token[Message | None] | None) -> None:
        """ipykernel 7: undo the :meth:`set_thread_parent` that returned ``token``."""
        if token is not None:
            self._tracker().reset_current(token)

    @property
    def parent_header(self) -> dict[str, Any]:
        """ipykernel's ``ZMQInteractiveShell.parent_header``: the same message
        dict as :meth:`get_parent` (the whole request, as ipykernel keeps it)."""
        return self.get_parent()

    def init_virtualenv(self) -> None:
        """As ipykernel's: no virtualenv detection (and no warning about it);
        a kernel runs in the environment it was installed into."""


ZMQInteractiveShell.__module__ = "ipykernel.zmqshell"
