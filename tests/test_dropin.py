"""Tier 3: the conventions frontends and tools rely on under ipykernel (issue 25).

Each test drives a real kernel through jupyter_client: an interrupt at a
``pdb.set_trace()`` prompt ends the debugger.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from conftest import TIMEOUT, execute, start_kernel, stop_kernel

if TYPE_CHECKING:
    from collections.abc import Iterator

import pytest


@pytest.fixture
def own_kernel(jupyter_path: str) -> Iterator[tuple[Any, Any]]:
    """A kernel of the test's own (the test may end it)."""
    km, kc = start_kernel("trikernel-test-signal")
    yield km, kc
    stop_kernel(km, kc)


def reply_to(kc: Any, msg_id: str, timeout: float = TIMEOUT) -> dict[str, Any]:
    """The shell reply to ``msg_id`` (earlier replies are skipped)."""
    deadline = time.monotonic() + timeout
    while True:
        r = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if r["parent_header"].get("msg_id") == msg_id:
            return dict(r)


@pytest.mark.parametrize("how", ["pdb.set_trace()", "breakpoint()"])
def test_an_interrupt_at_a_pdb_prompt_ends_the_cell(own_kernel: tuple[Any, Any], how: str) -> None:
    """ipykernel's ``init_pdb``: IPython's InterruptiblePdb quits the debugger
    on an interrupt and the cell runs on to its end, as under ipykernel (its
    reply is ``ok`` there too). Before, stdlib pdb caught the
    KeyboardInterrupt, printed ``--KeyboardInterrupt--`` and prompted again:
    the cell never ended, nor did the one queued behind it."""
    km, kc = own_kernel
    msg_id = kc.execute(f"import pdb\n{how}\nprint('after')", allow_stdin=True)
    queued = kc.execute("3 + 4")
    request = kc.get_stdin_msg(timeout=TIMEOUT)  # the pdb prompt: the cell waits for input
    assert request["msg_type"] == "input_request"
    km.interrupt_kernel()
    reply = reply_to(kc, msg_id)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert reply_to(kc, queued)["content"]["status"] == "ok"
    r, out = execute(kc, "1 + 1")
    assert r["content"]["status"] == "ok"
    assert [m["content"]["data"]["text/plain"] for m in out if m["msg_type"] == "execute_result"] == ["2"]
