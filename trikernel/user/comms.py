"""``comm`` package integration: kernel-side comms publish on IOPub.

Replaces ``comm.create_comm`` and ``comm.get_comm_manager`` so that
ipywidgets and other comm users talk through trikernel. Comm messages from
the frontend (comm_open / comm_msg / comm_close, messaging spec "Custom
Messages") are dispatched to the manager on the main thread, as
jupyter_client-style message dicts, so ``on_msg`` handlers run there.

Runs on: the user run of the comm's lane (main thread or a subshell
thread: handlers, ``comm_info``); ``TrikernelComm.publish_msg`` any
thread but the io thread; :func:`install` on the main thread at set-up.
"""

from __future__ import annotations

import itertools
import os
from typing import TYPE_CHECKING, Any

import comm
from comm.base_comm import BaseComm, BuffersType, CommManager, MaybeDict

from trikernel.errors import ProtocolError
from trikernel.user.kernelhandle import message_dict

if TYPE_CHECKING:
    from trikernel.protocol.wire import Message
    from trikernel.user.outstream import Publisher

_COMM_PREFIX = os.urandom(8).hex()
_COMM_COUNTER = itertools.count()


def new_comm_id() -> str:
    """32 hex digits, unique across processes (random prefix + counter)."""
    return f"{_COMM_PREFIX}{next(_COMM_COUNTER):016x}"


class TrikernelComm(BaseComm):
    """A comm whose messages go through the IOPub queue (with backpressure)."""

    publisher: Publisher  # set by install()
    shell: Any = None  # set by set_shell()

    def publish_msg(
        self,
        msg_type: str,
        data: MaybeDict = None,
        metadata: MaybeDict = None,
        buffers: BuffersType = None,
        **keys: Any,
    ) -> None:
        """``comm.base_comm.BaseComm.publish_msg``, the hook every comm_open / comm_msg /
        comm_close the kernel sends goes through: content ``{"data", "comm_id", **keys}`` goes
        to trikernel's :class:`~trikernel.user.outstream.Publisher`, parented to the running
        request, through the IOPub queue (blocks while it is full: backpressure) instead of
        ipykernel's session and socket (messaging spec "Custom Messages"). Any user thread."""
        content = {"data": {} if data is None else data, "comm_id": self.comm_id, **keys}
        bufs = tuple(bytes(b) for b in buffers) if buffers else ()
        TrikernelComm.publisher.send(msg_type, content, metadata, bufs)

    def close(
        self,
        data: MaybeDict = None,
        metadata: MaybeDict = None,
        buffers: BuffersType = None,
        deleting: bool = False,
    ) -> None:
        """``comm.base_comm.BaseComm.close``: publish ``comm_close`` and unregister the comm,
        which is unregistered even if the publish raises. BaseComm marks the comm closed
        before it publishes and unregisters it after: an interrupt landing in the publish
        (the fuzzer's interrupt_request during a comm_open of an unknown target, whose
        handler closes the comm) left a closed comm registered for the kernel's life,
        listed by every ``comm_info_reply``. Any thread but the io thread."""
        if self._closed:
            return
        try:
            super().close(data, metadata, buffers, deleting)
        finally:
            if not deleting:  # deleting: __del__ of a comm that is no longer registered
                manager = comm.get_comm_manager()
                if manager.comms.get(self.comm_id) is self:
                    del manager.comms[self.comm_id]

    def handle_msg(self, msg: dict[str, Any]) -> None:
        # ipykernel brackets comm callbacks with pre/post_execute so that
        # e.g. matplotlib figures made in a widget callback are flushed.
        # An error in the callback is shown as an ``error`` output parented to
        # the comm_msg (as ipywidgets shows its callbacks' errors).
        """``comm.base_comm.BaseComm.handle_msg`` for a frontend comm_msg: as ipykernel, the
        ``on_msg`` callback runs between the shell's ``pre_execute`` and ``post_execute``
        events (so e.g. matplotlib figures a widget callback draws are flushed); unlike
        BaseComm, anything it raises, BaseExceptions included, becomes an IOPub ``error``
        parented to the comm_msg. Without a callback or a shell, BaseComm's. User run (the
        comm's lane)."""
        shell = TrikernelComm.shell
        if self._msg_callback and shell is not None:
            shell.events.trigger("pre_execute")
            try:
                self._msg_callback(msg)
            except BaseException:
                shell.showtraceback()
            finally:
                shell.events.trigger("post_execute")
        else:
            super().handle_msg(msg)


def install(publisher: Publisher) -> CommManager:
    """Wire ``comm`` to trikernel; returns the one CommManager."""
    TrikernelComm.publisher = publisher
    manager = CommManager()

    def create_comm(*args: Any, **kwargs: Any) -> TrikernelComm:
        # A comm_id without a syscall: comm's default (uuid4) reads
        # os.urandom, which releases the GIL on every comm and lets the io
        # thread preempt the cell (a third of a widget burst's time).
        if not kwargs.get("comm_id"):
            kwargs["comm_id"] = new_comm_id()
        return TrikernelComm(*args, **kwargs)

    comm.create_comm = create_comm
    comm.get_comm_manager = lambda: manager
    return manager


def set_shell(shell: Any) -> None:
    """Give every :class:`TrikernelComm` the IPython shell whose events bracket comm callbacks
    and which shows their errors (user/interpreter.py, once IPython is up). Main thread."""
    TrikernelComm.shell = shell


def check_content(msg: Message) -> None:
    """Refuse frontend comm content that ``comm``'s manager cannot take.

    Spec "Custom Messages": ``comm_id`` a string (comm builds an ASCII
    topic from it), ``target_name`` a string (comm_open), ``data`` and
    ``metadata`` objects when present. Anything else would raise inside
    ``comm`` (unhashable keys, bad topics) or reach other clients as an
    invalid IOPub ``comm_close``. Raises ProtocolError (kind "bad_content").
    """
    c = msg.content
    comm_id = c.get("comm_id")
    if not isinstance(comm_id, str) or not comm_id or not comm_id.isascii():
        raise ProtocolError(f"{msg.msg_type}: comm_id must be a non-empty ASCII string", "bad_content")
    if msg.msg_type == "comm_open" and not isinstance(c.get("target_name"), str):
        raise ProtocolError("comm_open: target_name must be a string", "bad_content")
    for name in ("data", "metadata"):
        if not isinstance(c.get(name, {}), dict):
            raise ProtocolError(f"{msg.msg_type}: {name} must be an object", "bad_content")


def dispatch(manager: CommManager, msg: Message) -> None:
    """Run the manager's handler for a frontend comm_open/comm_msg/comm_close.

    Raises ProtocolError (kind "bad_content") for content of the wrong
    shape (:func:`check_content`); nothing reaches a handler then.

    ``comm`` logs an Exception from a handler; anything else the handler
    raises (SystemExit, KeyboardInterrupt, other BaseExceptions) is the
    user's too: shown as an ``error`` output parented to ``msg``, never
    passed into the kernel's runs.
    """
    check_content(msg)
    handler = getattr(manager, msg.msg_type)
    try:
        handler(None, None, message_dict(msg))  # the dict shape comm handlers take
    except BaseException:
        shell = TrikernelComm.shell
        if shell is None:
            raise
        shell.showtraceback()


def comm_info(manager: CommManager, target_name: str | None) -> dict[str, Any]:
    """``comm_info_reply`` content (messaging spec "Comm info"): ``{"status": "ok", "comms":
    {comm_id: {"target_name": name}}}`` for every open comm of ``manager``, or only those of
    ``target_name`` when it is not None. User run."""
    comms = {
        cid: {"target_name": c.target_name}
        for cid, c in list(manager.comms.items())
        if target_name is None or c.target_name == target_name
    }
    return {"status": "ok", "comms": comms}
