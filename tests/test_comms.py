"""Tier 2: trikernel's comm integration (user/comms.py) in process, with a fake publisher."""

from __future__ import annotations

from typing import Any

import comm as comm_pkg
import pytest

from trikernel.protocol.wire import Message
from trikernel.user import comms


class InterruptedPublisher:
    """Publishes everything but ``comm_close``, where a KeyboardInterrupt lands
    (an interrupt_request's SIGINT arriving while the comm_close is signed)."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, msg_type: str, content: dict[str, Any], metadata: Any = None, buffers: Any = ()) -> None:
        self.sent.append(msg_type)
        if msg_type == "comm_close":
            raise KeyboardInterrupt


@pytest.fixture
def manager(monkeypatch: pytest.MonkeyPatch) -> Any:
    """comms.install with the fake publisher; comm's module functions and the
    class attributes install sets are put back after the test."""
    monkeypatch.setattr(comm_pkg, "create_comm", comm_pkg.create_comm)
    monkeypatch.setattr(comm_pkg, "get_comm_manager", comm_pkg.get_comm_manager)
    monkeypatch.setattr(comms.TrikernelComm, "publisher", None, raising=False)
    monkeypatch.setattr(comms.TrikernelComm, "shell", None)
    return comms.install(InterruptedPublisher())  # type: ignore[arg-type]


def test_comm_open_of_an_unknown_target_interrupted_in_its_close_leaves_no_comm(manager):
    """Fuzzer (issue 26): a frontend comm_open whose target is not registered is
    answered by closing the comm; an interrupt_request landing in that close
    left the comm marked closed but registered, for the kernel's life, and
    listed by every comm_info_reply (3 of 400 such comm_opens beside
    interrupts, in a real kernel)."""
    msg = Message(
        header={"msg_id": "m1", "msg_type": "comm_open"},
        content={"comm_id": "c1", "target_name": "fuzz", "data": {}},
    )
    with pytest.raises(KeyboardInterrupt):  # shown to the user as the handler's error in a kernel
        comms.dispatch(manager, msg)
    assert comms.TrikernelComm.publisher.sent == ["comm_close"]
    assert manager.comms == {}
    assert comms.comm_info(manager, None) == {"status": "ok", "comms": {}}


def test_a_kernel_side_comm_whose_close_is_interrupted_is_unregistered(manager):
    """The same cut in a comm the user's code opened and closes (``widget.close()``
    while an interrupt comes): closed, so no longer registered."""
    c = comm_pkg.create_comm(target_name="t")
    assert manager.comms == {c.comm_id: c}
    with pytest.raises(KeyboardInterrupt):
        c.close()
    assert comms.TrikernelComm.publisher.sent == ["comm_open", "comm_close"]
    assert manager.comms == {}
    c.close()  # closed already: nothing sent, nothing raised
    assert comms.TrikernelComm.publisher.sent == ["comm_open", "comm_close"]
