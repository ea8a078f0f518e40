"""Tier 2: the user run's driver (guestrun.py) with a host loop made of a queue.

One trio run moves between plain driving and a host's loop and back; its
tasks, token and deadlines survive every switch, and it returns, raises and
takes interrupts as trio.run does. The real GUI hosts are tested with real
kernels in test_gui.py.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from trikernel.user import guestrun

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(guestrun.UNSUPPORTED is not None, reason=str(guestrun.UNSUPPORTED)),
]


class QueueHost:
    """The smallest host loop: callbacks from a queue, on the main thread."""

    def __init__(self, name: str = "queue") -> None:
        self.name = name
        self.q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.stopping = False
        self.loops = 0
        self.callbacks = 0
        self.on_stop: Any = None  # host code run as the loop is told to stop

    def run_sync_soon_threadsafe(self, fn: Any) -> None:
        self.q.put(fn)

    run_sync_soon_not_threadsafe = run_sync_soon_threadsafe

    def loop(self) -> None:
        assert threading.current_thread() is threading.main_thread()
        self.loops += 1
        self.stopping = False
        while not self.stopping:
            self.q.get()()
            self.callbacks += 1

    def stop_loop(self) -> None:
        self.stopping = True
        if self.on_stop is not None:
            self.on_stop()


def test_trio_internals_are_there():
    # a trio release that moves them turns this red (GUI hosting would be off)
    assert guestrun.UNSUPPORTED is None


def test_returns_and_raises_as_trio_run():
    async def value():
        await trio.lowlevel.checkpoint()
        return 42

    async def fails():
        await trio.lowlevel.checkpoint()
        raise ValueError("boom")

    assert guestrun.run(value) == 42
    with pytest.raises(ValueError, match="boom"):
        guestrun.run(fails)


def test_off_the_main_thread_it_is_trio_run():
    # subshell threads run trio runs of their own; a GUI loop can only own the main thread
    seen: list[Any] = []

    async def where():
        seen.append(guestrun.current())
        return threading.current_thread().name

    t = threading.Thread(target=lambda: seen.append(guestrun.run(where)), name="not-main")
    t.start()
    t.join(10)
    assert seen == [None, "not-main"]


def test_tasks_token_and_deadlines_survive_switches():
    hosts = [QueueHost("a"), QueueHost("b")]
    seen: list[Any] = []

    async def main():
        driver = guestrun.current()
        token = trio.lowlevel.current_trio_token()
        tick = trio.Event()

        async def ticker():
            while True:
                tick.set()
                await trio.sleep(0.001)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            for host in [hosts[0], None, hosts[1], hosts[0], None] * 4:
                driver.use_host(host)
                await trio.sleep(0.02)  # the switch happens at this await
                assert driver.host is host
                assert trio.lowlevel.current_trio_token() is token
                # the other task runs under the new host too: it ticks again. (Not "it
                # ticked during the sleep": descheduled past both deadlines, the two
                # tasks wake in one batch, in trio's random order.)
                tick = trio.Event()
                with trio.move_on_after(5):
                    await tick.wait()
                seen.append((host, tick.is_set()))
            nursery.cancel_scope.cancel()
        return "done"

    assert guestrun.run(main) == "done"
    assert all(ticked for _host, ticked in seen), seen
    assert hosts[0].loops == 8
    assert hosts[1].loops == 4
    assert all(h.callbacks > 0 for h in hosts)


def test_run_that_ends_while_hosted_stops_the_host_loop():
    host = QueueHost()

    async def main():
        guestrun.current().use_host(host)
        await trio.sleep(0.01)
        assert guestrun.current().host is host
        return "ended hosted"

    assert guestrun.run(main) == "ended hosted"
    assert host.stopping
    assert guestrun.current() is None


def test_host_code_between_batches_wakes_the_run():
    # trio's guest contract: sync trio calls from host callbacks wake the run
    host = QueueHost()

    async def main():
        guestrun.current().use_host(host)
        await trio.lowlevel.checkpoint()
        event = trio.Event()
        host.q.put(event.set)  # runs in the host loop, outside any batch
        with trio.fail_after(5):
            await event.wait()
        # a switch asked from host code; host code between that batch and
        # the plain driver's first wait wakes a task: the wait must not sleep
        # through it (the timeout was computed before, with nothing to run)
        stopped = trio.Event()
        host.on_stop = stopped.set
        host.q.put(lambda: guestrun.current().use_host(None))
        t0 = trio.current_time()
        with trio.fail_after(30):  # the wait that would sleep through it ends at this deadline
            await stopped.wait()
        assert trio.current_time() - t0 < 10  # woken by the event, not by the deadline
        assert guestrun.current().host is None
        return "woken"

    assert guestrun.run(main) == "woken"


def test_a_host_that_fails_to_take_a_batch_hands_back_to_the_plain_run(caplog):
    class BrokenHost(QueueHost):
        def run_sync_soon_not_threadsafe(self, fn: Any) -> None:
            raise RuntimeError("the toolkit is gone")

    host = BrokenHost()

    async def main():
        guestrun.current().use_host(host)
        for _ in range(3):
            await trio.lowlevel.checkpoint()  # a batch with more to run: posted "not threadsafe"
        await trio.sleep(0.01)
        return guestrun.current().host, guestrun.current().wanted

    assert guestrun.run(main) == (None, None)
    assert "failed to host the user run; back to the plain run" in caplog.text


def _interrupt_soon(delay: float) -> threading.Thread:
    main = threading.main_thread().ident
    assert main is not None

    def kill() -> None:
        time.sleep(delay)  # no event marks "the task is waiting": a generous head start
        signal.pthread_kill(main, signal.SIGINT)

    t = threading.Thread(target=kill)
    t.start()
    return t


@pytest.mark.parametrize("hosted", [False, True], ids=["plain", "hosted"])
def test_interrupt_reaches_an_awaiting_main_task(hosted):
    host = QueueHost()

    async def main():
        if hosted:
            guestrun.current().use_host(host)
            await trio.lowlevel.checkpoint()
        t = _interrupt_soon(0.2)
        try:
            with pytest.raises(KeyboardInterrupt):
                await trio.sleep(30)
        finally:
            t.join()
        return guestrun.current().host

    assert guestrun.run(main) is (host if hosted else None)


def test_interrupt_breaks_sync_code_in_a_hosted_batch():
    host = QueueHost()

    async def main():
        guestrun.current().use_host(host)
        await trio.lowlevel.checkpoint()
        t = _interrupt_soon(0.2)
        try:
            with pytest.raises(KeyboardInterrupt):
                time.sleep(30)  # noqa: ASYNC251 - the sync code a cell runs, interrupted
        finally:
            t.join()
        return "interrupted"

    assert guestrun.run(main) == "interrupted"


def _thread_masks(comm: str) -> list[int]:
    """SigBlk of this process's threads whose OS name is ``comm`` (Linux /proc)."""
    out = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(OSError):
            if (task / "comm").read_text().strip() == comm:
                status = (task / "status").read_text()
                out.append(int(next(ln for ln in status.splitlines() if ln.startswith("SigBlk")).split()[1], 16))
    return out


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc to read thread signal masks")
def test_trios_io_thread_blocks_sigint():
    # a process-directed SIGINT must reach the main thread (docs/design.md)
    host = QueueHost()
    masks: list[int] = []
    deadline = time.monotonic() + 10

    def record() -> None:  # host callback while trio waits for I/O in its thread
        found = _thread_masks("trikernel-guest")
        if found or time.monotonic() > deadline:
            masks.extend(found)
            done.set()
        else:
            threading.Timer(0.01, host.q.put, (record,)).start()

    async def main():
        guestrun.current().use_host(host)
        await trio.lowlevel.checkpoint()
        host.q.put(record)
        with trio.fail_after(15):
            await done.wait()

    done = trio.Event()
    # leave an idle thread in trio's thread cache, started without SIGINT
    # blocked (as trio.to_thread from a cell does): the guest run reuses it
    trio.run(trio.to_thread.run_sync, lambda: None)
    guestrun.run(main)
    assert masks, "trio's I/O thread was not seen"
    assert all(m & (1 << (signal.SIGINT - 1)) for m in masks), [hex(m) for m in masks]
