"""The cyclic garbage collector runs on the main thread, never on the io thread (user/collector.py).

Found this round: CPython's collector runs in whichever thread crosses its
allocation threshold, and runs the garbage's ``__del__`` right there; while
the user run was idle that was the io thread, and a user ``__del__`` that
slept 3 s, in a reference cycle, held kernel_info on control for 3 s per
object (20 objects: 60 s; ipykernel 7.4: under 0.1 s).

- tier 1: the collection rule (:func:`due_generation`), CPython's;
- tier 2, in a fresh interpreter each (the collector changes the process's
  ``gc`` module): the main thread collects what other threads made, also
  in sync code; a main thread held in C is stood in for by the gc thread,
  never by the thread that allocates; ``gc.disable()`` / ``gc.enable()``
  keep their meaning; a forked child collects on its own again;
- tier 3: a real kernel whose io thread serves thousands of requests after
  a cell left cyclic garbage behind runs none of its finalizers.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import TIMEOUT, execute

from trikernel.user.collector import FULL_GROWTH, due_generation

pytestmark = pytest.mark.timeout(120)


# ------------------------------------------------------------------ tier 1: the rule


@pytest.mark.parametrize(
    ("count", "threshold", "growth", "want"),
    [
        ((700, 0, 0), (700, 10, 10), 0.0, None),  # not past the first threshold
        ((701, 0, 0), (700, 10, 10), 0.0, 0),
        ((701, 11, 0), (700, 10, 10), 0.0, 1),  # the oldest generation due
        ((701, 11, 11), (700, 10, 10), FULL_GROWTH / 2, 1),  # the heap has not grown enough for a full one
        ((701, 11, 11), (700, 10, 10), FULL_GROWTH * 2, 2),
        ((701, 0, 11), (700, 10, 10), FULL_GROWTH * 2, 2),
        ((5000, 50, 50), (0, 10, 10), 1.0, None),  # threshold 0: automatic collection off (CPython)
    ],
)
def test_the_generation_due_is_cpythons(count, threshold, growth, want) -> None:
    base = 100_000
    assert due_generation(count, threshold, int(base * (1 + growth)), base) == want


# ------------------------------------------------------------------ tier 2: in a fresh interpreter

_PRELUDE = """
import gc, os, sys, threading, time
from trikernel.user import collector
where = []
class Cycle:
    def __init__(self):
        self.me = self
    def __del__(self):
        where.append(threading.current_thread().name)
c = collector.start()
"""


def _run(body: str) -> str:
    code = _PRELUDE + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT * 2)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_garbage_other_threads_make_is_collected_on_the_main_thread_in_sync_code() -> None:
    out = _run(
        """
        def worker():
            for _ in range(20000):
                Cycle()
        t = threading.Thread(target=worker, name="worker")
        t.start()
        while t.is_alive():  # sync code, no sleep: the pending call runs between its bytecodes
            sum(range(100))
        # the main thread goes on making objects, as a program does: generation 0's
        # count is an estimate (CPython resets it when a collection starts and takes
        # off what the collection frees, so objects the worker made while finalizers
        # ran can sit under a count below the threshold); new objects make it due again
        keep = []
        deadline = time.monotonic() + 10
        while len(where) < 19000 and time.monotonic() < deadline:
            keep.append([])
            if len(keep) >= 10_000:  # bounded, if nothing is ever collected
                keep = []
        print(len(where), sorted(set(where)), c.statistics["main"] > 0, gc.isenabled())
        """
    )
    fields = out.split()
    assert int(fields[0]) >= 19000, out  # the worker's garbage was collected, nearly all of it
    assert "worker" not in out, out
    assert "['MainThread']" in out, out
    assert fields[-2:] == ["True", "True"], out  # collected on main; gc.isenabled() as the user left it


def test_a_main_thread_held_in_c_is_stood_in_for_by_the_gc_thread_not_the_allocating_one() -> None:
    out = _run(
        """
        def worker():
            end = time.monotonic() + 2 * collector.FALLBACK_DELAY + 1
            while time.monotonic() < end:  # garbage due for longer than FALLBACK_DELAY
                for _ in range(1000):
                    Cycle()
        t = threading.Thread(target=worker, name="worker")
        t.start()
        t.join()  # the main thread waits in C, the GIL released, all along
        print(sorted(set(where)), c.statistics["fallback"] > 0)
        """
    )
    assert "worker" not in out, out
    assert "trikernel-gc" in out, out
    assert out.split()[-1] == "True", out


def test_disable_and_enable_keep_their_meaning() -> None:
    out = _run(
        """
        gc.disable()
        assert not gc.isenabled()
        for _ in range(20000):
            Cycle()
        time.sleep(1)                 # polled many times: nothing is collected while disabled
        off = len(where)
        gc.enable()
        assert gc.isenabled()
        deadline = time.monotonic() + 10
        while len(where) < 19000 and time.monotonic() < deadline:
            sum(range(100))
        print(off, len(where))
        """
    )
    off, on = map(int, out.split())
    assert off == 0, out
    assert on >= 19000, out


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_collects_on_its_own() -> None:
    out = _run(
        """
        pid = os.fork()
        if pid == 0:
            ok = gc.isenabled() and gc.enable is not c._user_enable
            for _ in range(20000):
                Cycle()
            os._exit(0 if ok and len(where) > 0 else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
        """
    )
    assert out.split()[-1] == "0", out  # CPython's own collector ran in the child


# ------------------------------------------------------------------ tier 3: a real kernel


def test_no_finalizer_runs_on_the_io_thread(kernel) -> None:
    """A cell leaves 20 objects in reference cycles; the io thread then
    serves 3,000 kernel_info requests on control (each allocates: on main
    the collector ran there, and every ``__del__`` with it); then a cell
    collects. Every finalizer ran, none on the io thread."""
    _km, kc = kernel
    reply, _ = execute(
        kc,
        "import threading\n"
        "fin_threads = []\n"
        "class Slow:\n"
        "    def __init__(self):\n"
        "        self.me = self\n"
        "    def __del__(self):\n"
        "        fin_threads.append(threading.current_thread().name)\n"
        "for _ in range(20):\n"
        "    Slow()\n",
    )
    assert reply["content"]["status"] == "ok"
    for _ in range(3000):
        msg = kc.session.msg("kernel_info_request")
        kc.control_channel.send(msg)
        while True:
            r = kc.get_control_msg(timeout=TIMEOUT)
            if r["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                break
    _reply, out = execute(kc, "import gc; gc.collect(); len(fin_threads), sorted(set(fin_threads)), gc.isenabled()")
    result = next(m for m in out if m["msg_type"] == "execute_result")["content"]["data"]["text/plain"]
    assert result.startswith("(20,"), result
    assert "trikernel-io" not in result, result
    assert result.endswith("True)"), result  # gc.isenabled(): as the user left it
