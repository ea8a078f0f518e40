"""Output of threads goes to the cell that started them (issue 9, section 2).

Real kernel, jupyter_client client. In every test, a later cell B is
running when the thread prints, so output that followed the *latest*
request (trikernel before, and ipykernel 7.4.0) would be parented to B.
"""

from __future__ import annotations

import time
from typing import Any

from conftest import execute, stdout_of

TIMEOUT = 30


def _streams_until(kc: Any, done: str, needed: int) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """(line, parent msg_id) of every stream line, and every other message,
    until ``done``'s idle and ``needed`` lines. Text is joined per parent and
    stream before it is split (one print is two writes; another cell's
    output may come between them)."""
    text: dict[tuple[str, str], str] = {}
    others: list[dict[str, Any]] = []
    idle = False
    deadline = time.monotonic() + TIMEOUT

    def lines() -> list[tuple[str, str]]:
        return [(ln, parent) for (parent, _), t in text.items() for ln in t.splitlines()]

    while not (idle and len(lines()) >= needed):
        m = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        parent = m["parent_header"].get("msg_id", "")
        if m["msg_type"] == "stream":
            key = (parent, m["content"]["name"])
            text[key] = text.get(key, "") + m["content"]["text"]
        else:
            others.append(m)
        if m["msg_type"] == "status" and parent == done and m["content"]["execution_state"] == "idle":
            idle = True
    return lines(), others


def test_ticks_of_a_thread_stay_with_the_cell_that_started_it(kernel):
    """Issue 9's input: cell A's thread ticks during cell B and after A's idle."""
    _km, kc = kernel
    a = kc.execute(
        "import threading, time\n"
        "def f():\n"
        "    time.sleep(0.5)\n"
        "    for i in range(3):\n"
        "        print(f'tick {i}')\n"
        "        time.sleep(0.5)\n"
        "threading.Thread(target=f).start()\n"
    )
    b = kc.execute("time.sleep(2)")
    lines, _ = _streams_until(kc, b, 3)
    assert lines == [("tick 0", a), ("tick 1", a), ("tick 2", a)]


def test_thread_output_while_a_later_cell_runs_is_the_starting_cells(kernel):
    """Deterministic: the thread prints only once cell B tells it to, and B waits for it."""
    _km, kc = kernel
    a = kc.execute(
        "import threading\n"
        "go = threading.Event()\n"
        "def f():\n"
        "    go.wait()\n"
        "    print('from A thread')\n"
        "    import sys; print('on stderr', file=sys.stderr)\n"
        "    display('displayed from A thread')\n"
        "t = threading.Thread(target=f); t.start()\n"
    )
    b = kc.execute("go.set(); t.join(); print('B itself')")
    lines, others = _streams_until(kc, b, 3)
    assert ("from A thread", a) in lines
    assert ("on stderr", a) in lines
    assert ("B itself", b) in lines
    shown = [m for m in others if m["msg_type"] == "display_data"]
    assert [m["parent_header"]["msg_id"] for m in shown] == [a]


def test_threads_started_by_threads_timer_and_subclasses(kernel):
    _km, kc = kernel
    a = kc.execute(
        "import sys, threading\n"
        "go = threading.Event()\n"
        "done = []\n"
        "say = lambda text: sys.stdout.write(text + '\\n')  # one write: three threads print at once\n"
        "def grandchild():\n"
        "    go.wait(); say('grandchild')\n"
        "def child():\n"
        "    g = threading.Thread(target=grandchild); g.start(); done.append(g)\n"
        "c = threading.Thread(target=child); c.start(); c.join()\n"
        "class Sub(threading.Thread):\n"
        "    def run(self):\n"
        "        go.wait(); say('subclass')\n"
        "s = Sub(); s.start()\n"
        "timer = threading.Timer(0.05, lambda: (go.wait(), say('timer')))\n"
        "timer.start()\n"
    )
    b = kc.execute("go.set(); done[0].join(); s.join(); timer.join(); print('B')")
    lines, _ = _streams_until(kc, b, 4)
    assert sorted(lines) == sorted([("grandchild", a), ("subclass", a), ("timer", a), ("B", b)])


def test_thread_pool_work_goes_to_the_cell_that_submitted_it(kernel):
    """The pool's worker threads start in cell P and are reused by A and B:
    each work item keeps the cell that submitted it."""
    _km, kc = kernel
    p = kc.execute(
        "from concurrent.futures import ThreadPoolExecutor\n"
        "import threading\n"
        "pool = ThreadPoolExecutor(max_workers=2)\n"
        "pool.submit(print, 'warm-up').result()\n"
    )
    a = kc.execute(
        "import sys\n"
        "go = threading.Event()\n"
        "say = lambda text: sys.stdout.write(text + '\\n')  # one write: lines of two workers stay whole\n"
        "fut = pool.submit(lambda: (go.wait(), say('submitted in A')))\n"
        "mapped = pool.map(lambda i: (go.wait(), say(f'mapped in A {i}')), range(2))\n"
    )
    b = kc.execute("go.set(); fut.result(); list(mapped)\npool.submit(print, 'submitted in B').result()\nprint('B')")
    lines, _ = _streams_until(kc, b, 6)
    assert sorted(lines) == sorted(
        [
            ("warm-up", p),
            ("submitted in A", a),
            ("mapped in A 0", a),
            ("mapped in A 1", a),
            ("submitted in B", b),
            ("B", b),
        ]
    )


def test_thread_started_by_a_background_trio_task(kernel):
    """A trio task keeps its cell (context copied at spawn); a thread it starts does too."""
    _km, kc = kernel
    a = kc.execute(
        "import threading, trio\n"
        "go = threading.Event()\n"
        "async def task():\n"
        "    threading.Thread(target=lambda: (go.wait(), print('thread of a task'))).start()\n"
        "nursery.start_soon(task)\n"
    )
    b = kc.execute("import time\ntime.sleep(0.2)\ngo.set()\nprint('B')")
    lines, _ = _streams_until(kc, b, 2)
    assert sorted(lines) == sorted([("thread of a task", a), ("B", b)])


def test_other_context_variables_do_not_travel_into_threads(kernel):
    """Only the request travels: threads start with an empty context, as in Python 3.11."""
    _km, kc = kernel
    _reply, out = execute(
        kc,
        "import contextvars, threading\n"
        "v = contextvars.ContextVar('v', default='unset')\n"
        "v.set('cell')\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(v.get())); t.start(); t.join()\n"
        "print(seen)\n",
    )
    assert stdout_of(out) == "['unset']\n"
