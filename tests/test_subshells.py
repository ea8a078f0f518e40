"""Kernel subshells (JEP 91) on a real kernel, driven by jupyter_client.

Requests to subshells are sent with ``header.subshell_id`` set; replies from
different subshells arrive in any order, so they are collected by msg_id
(:class:`Wire`). Every wait has a deadline. Latency bounds (0.5 s while the
main shell sleeps) are the issue's correctness deadlines, not benchmarks:
docs/subshells.md has the measured figures.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
from conftest import TIMEOUT, ValidatingClient, start_kernel, stop_kernel

from trikernel.conformance.client import Channels

if TYPE_CHECKING:
    from collections.abc import Iterator

    from jupyter_client.manager import KernelManager


class Wire:
    """A client's shell and IOPub traffic, sorted by the request they belong to."""

    def __init__(self, kc: ValidatingClient):
        self.kc = kc
        self.replies: dict[str, dict[str, Any]] = {}
        self.iopub: dict[str, list[dict[str, Any]]] = {}

    # -- sending ------------------------------------------------------------------
    def send(self, msg_type: str, content: dict[str, Any] | None = None, subshell_id: str | None = None) -> str:
        msg = self.kc.session.msg(msg_type, content or {})
        if subshell_id is not None:
            msg["header"]["subshell_id"] = subshell_id
        self.kc.shell_channel.send(msg)
        return str(msg["header"]["msg_id"])

    def execute(self, code: str, subshell_id: str | None = None, **kw: Any) -> str:
        return self.send("execute_request", Channels.execute_content(code, **kw), subshell_id)

    def control(self, msg_type: str, content: dict[str, Any] | None = None) -> dict[str, Any]:
        msg = self.kc.session.msg(msg_type, content or {})
        self.kc.control_channel.send(msg)
        deadline = time.monotonic() + TIMEOUT
        while True:
            reply = self.kc.get_control_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return reply

    def create(self) -> str:
        reply = self.control("create_subshell_request")
        assert reply["content"]["status"] == "ok", reply["content"]
        return str(reply["content"]["subshell_id"])

    def delete(self, subshell_id: str) -> dict[str, Any]:
        return self.control("delete_subshell_request", {"subshell_id": subshell_id})["content"]

    def list(self) -> list[str]:
        return list(self.control("list_subshell_request")["content"]["subshell_id"])

    # -- receiving ----------------------------------------------------------------
    def reply(self, msg_id: str, timeout: float = TIMEOUT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while msg_id not in self.replies:
            msg = self.kc.get_shell_msg(timeout=max(0.05, deadline - time.monotonic()))
            self.replies[msg["parent_header"].get("msg_id", "")] = msg
        return self.replies.pop(msg_id)

    def outputs(self, msg_id: str, timeout: float = TIMEOUT) -> list[dict[str, Any]]:
        """The IOPub messages of ``msg_id`` up to and including its idle."""
        deadline = time.monotonic() + timeout
        while not self._idle(msg_id):
            msg = self.kc.get_iopub_msg(timeout=max(0.05, deadline - time.monotonic()))
            self.iopub.setdefault(msg["parent_header"].get("msg_id", ""), []).append(msg)
        return self.iopub.pop(msg_id)

    def _idle(self, msg_id: str) -> bool:
        return any(
            m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" for m in self.iopub.get(msg_id, [])
        )

    def run(self, code: str, subshell_id: str | None = None, **kw: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        msg_id = self.execute(code, subshell_id, **kw)
        return self.reply(msg_id), self.outputs(msg_id)

    def wait_printed(self, msg_id: str, marker: str, timeout: float = TIMEOUT) -> None:
        """Until request ``msg_id`` has printed ``marker`` (its code is past that print)."""
        deadline = time.monotonic() + timeout
        while marker not in stdout(self.iopub.get(msg_id, [])):
            msg = self.kc.get_iopub_msg(timeout=max(0.05, deadline - time.monotonic()))
            self.iopub.setdefault(msg["parent_header"].get("msg_id", ""), []).append(msg)


def stdout(outputs: list[dict[str, Any]]) -> str:
    return "".join(
        m["content"]["text"] for m in outputs if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"
    )


def states(outputs: list[dict[str, Any]]) -> list[str]:
    return [m["content"]["execution_state"] for m in outputs if m["msg_type"] == "status"]


@pytest.fixture(scope="module")
def wire(jupyter_path: str) -> Iterator[Wire]:
    km, kc = start_kernel("trikernel-test-signal")
    w = Wire(kc)
    w.run("import threading, time, trio")
    yield w
    stop_kernel(km, kc)


@pytest.fixture
def fresh(jupyter_path: str, tmp_path: Any, request: pytest.FixtureRequest) -> Iterator[tuple[KernelManager, Wire]]:
    """A kernel of its own; ``request.param``: the interrupt mode (default message)."""
    mode = getattr(request, "param", "message")
    km, kc = start_kernel(f"trikernel-test-{mode}", stderr=open(tmp_path / "kernel.log", "w"))  # noqa: SIM115
    yield km, Wire(kc)
    stop_kernel(km, kc)


@pytest.fixture
def subshell(wire: Wire) -> Iterator[str]:
    subshell_id = wire.create()
    yield subshell_id
    if subshell_id in wire.list():
        wire.delete(subshell_id)


# -- protocol ---------------------------------------------------------------------------
def test_kernel_info_lists_kernel_subshells(wire: Wire) -> None:
    wire.kc.kernel_info()
    reply = wire.kc.get_shell_msg(timeout=TIMEOUT)
    assert "kernel subshells" in reply["content"]["supported_features"]


def test_create_list_delete(wire: Wire) -> None:
    assert wire.list() == []
    a, b = wire.create(), wire.create()
    assert a != b
    assert wire.list() == [a, b]  # creation order; the main shell is not listed
    assert wire.delete(a) == {"status": "ok"}
    assert wire.list() == [b]
    assert wire.delete(b)["status"] == "ok"
    assert wire.list() == []


def test_unknown_subshell_ids_are_errors(wire: Wire) -> None:
    content = wire.delete("no-such-subshell")
    assert (content["status"], content["ename"]) == ("error", "UnknownSubshellError")
    assert "no-such-subshell" in content["evalue"]
    assert wire.control("delete_subshell_request", {})["content"]["ename"] == "UnknownSubshellError"
    msg_id = wire.execute("1 + 1", "no-such-subshell")
    reply = wire.reply(msg_id)
    assert (reply["content"]["status"], reply["content"]["ename"]) == ("error", "UnknownSubshellError")
    assert states(wire.outputs(msg_id)) == ["busy", "idle"]
    # a comm message (no reply): busy/idle, so the client sees it handled
    comm_id = wire.send("comm_msg", {"comm_id": "nope", "data": {}}, "no-such-subshell")
    assert states(wire.outputs(comm_id)) == ["busy", "idle"]


def test_subshell_runs_on_its_own_thread_and_ends_when_deleted(wire: Wire) -> None:
    """Its own thread, named for it, gone once the delete reply has left.
    Counted by name: ``threading.active_count()`` also counts trio's cached
    worker threads, which come and go (a clean-clone run saw 7 for 6)."""
    code = (
        "print(sorted(t.name for t in threading.enumerate() if t.name.startswith('trikernel-subshell-')), "
        "threading.current_thread() is threading.main_thread())"
    )
    before = stdout(wire.run(code)[1])
    subshell_id = wire.create()
    during = stdout(wire.run(code)[1])
    assert subshell_id not in before, before
    assert f"trikernel-subshell-{subshell_id}" in during, during
    in_subshell = stdout(wire.run(code, subshell_id)[1])
    assert (in_subshell.split()[-1], before.split()[-1]) == ("False", "True")
    wire.delete(subshell_id)  # idle: its thread has ended when the reply leaves
    after = stdout(wire.run(code)[1])
    assert subshell_id not in after, after


def test_subshell_magic_prints_what_ipykernel_prints(wire: Wire, subshell: str) -> None:
    main = stdout(wire.run("%subshell")[1]).splitlines()
    sub = stdout(wire.run("%subshell", subshell)[1]).splitlines()
    keys = ["subshell id", "thread id", "main thread id", "pid", "thread count", "subshell list"]
    assert [line.split(":")[0] for line in main] == keys
    assert (main[0], sub[0]) == ("subshell id: None", f"subshell id: {subshell}")
    assert f"subshell list: ['{subshell}']" in sub
    assert sub[1] != main[1]
    assert sub[2] == main[2] == main[1].replace("thread id", "main thread id")


# -- concurrency ------------------------------------------------------------------------
def test_subshell_answers_while_main_sleeps(wire: Wire, subshell: str) -> None:
    wire.run(
        "from comm import create_comm\n"
        "ran = []\n"
        "c = create_comm(target_name='subshell-test')\n"
        "c.on_msg(lambda m: (ran.append(threading.current_thread().name), print('handled')))"
    )
    comm_id = stdout(wire.run("print(c.comm_id)")[1]).strip()
    wire.run("release = threading.Event()")
    # the main shell is busy until the test releases it, after the subshell answered:
    # answered while it was busy, by construction (no wall-clock bound, issue 26)
    main = wire.execute("print('SLEEPING', flush=True); release.wait(120)")
    wire.wait_printed(main, "SLEEPING")
    reply, outputs = wire.run("1 + 1", subshell)
    assert reply["content"]["status"] == "ok"
    assert [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "execute_result"] == ["2"]
    msg_id = wire.send("comm_msg", {"comm_id": comm_id, "data": {"x": 1}}, subshell)
    comm_outputs = wire.outputs(msg_id)
    assert "handled" in stdout(comm_outputs)  # output parented to the comm message
    wire.run("release.set()", subshell)
    assert wire.reply(main)["content"]["status"] == "ok"
    assert wire.outputs(main)
    assert stdout(wire.run("print(ran)")[1]).strip() == f"['trikernel-subshell-{subshell}']"


def test_namespace_is_shared(wire: Wire, subshell: str) -> None:
    assert wire.run("from_subshell = 6 * 7", subshell)[0]["content"]["status"] == "ok"
    assert stdout(wire.run("print(from_subshell)")[1]).strip() == "42"
    wire.run("from_main = 'main'")
    assert stdout(wire.run("print(from_main)", subshell)[1]).strip() == "main"


def test_history_is_shared(wire: Wire, subshell: str) -> None:
    """One history, as ipykernel (docs/subshells.md says why not one per subshell)."""
    n_main = wire.run("'from the main shell'")[0]["content"]["execution_count"]
    n_sub = wire.run("'from the subshell'", subshell)[0]["content"]["execution_count"]
    for sid in (None, subshell):
        msg_id = wire.send("history_request", {"hist_access_type": "tail", "n": 2, "raw": True, "output": False}, sid)
        history = wire.reply(msg_id)["content"]["history"]
        assert [(line, source) for _session, line, source in history] == [
            (n_main, "'from the main shell'"),
            (n_sub, "'from the subshell'"),
        ]


def test_three_subshells_sleep_at_once(wire: Wire) -> None:
    """Three subshells run at once: each cell waits at a barrier of three,
    which only three cells running together pass (in turn, the first would
    wait out the barrier's timeout and raise BrokenBarrierError)."""
    ids = [wire.create() for _ in range(3)]
    wire.run("at_once = threading.Barrier(3, timeout=120)")
    msg_ids = [wire.execute("at_once.wait(); time.sleep(0.1)", sid) for sid in ids]
    replies = [wire.reply(m, timeout=150) for m in msg_ids]
    assert all(r["content"]["status"] == "ok" for r in replies), [r["content"] for r in replies]
    for sid in ids:
        wire.delete(sid)


def test_outputs_status_and_counts_are_parented(wire: Wire, subshell: str) -> None:
    msg_id = wire.execute("print('out'); 7", subshell)
    reply, outputs = wire.reply(msg_id), wire.outputs(msg_id)
    assert reply["parent_header"]["subshell_id"] == subshell
    assert all(m["parent_header"]["subshell_id"] == subshell for m in outputs)
    assert [m["msg_type"] for m in outputs] == ["status", "execute_input", "stream", "execute_result", "status"]
    assert states(outputs) == ["busy", "idle"]
    count = reply["content"]["execution_count"]
    assert outputs[1]["content"]["execution_count"] == count == outputs[3]["content"]["execution_count"]
    # one kernel-wide count, as ipykernel: the next main cell takes the next number
    assert wire.run("8")[0]["content"]["execution_count"] == count + 1


def test_overlapping_cells_get_their_own_numbers(wire: Wire, subshell: str) -> None:
    """The main cell is numbered when it starts; a subshell cell that starts
    and ends while it runs takes the next number, and each cell's Out[n],
    reply and history are its own."""
    main = wire.execute("print('SLEEPING', flush=True); time.sleep(0.5); 'main'")
    wire.wait_printed(main, "SLEEPING")
    sub_reply, sub_out = wire.run("'sub'", subshell)
    main_reply, main_out = wire.reply(main), wire.outputs(main)
    n_main, n_sub = main_reply["content"]["execution_count"], sub_reply["content"]["execution_count"]
    assert n_sub == n_main + 1
    results = {
        m["content"]["execution_count"]: m["content"]["data"]["text/plain"]
        for m in main_out + sub_out
        if m["msg_type"] == "execute_result"
    }
    assert results == {n_main: "'main'", n_sub: "'sub'"}
    check = stdout(wire.run(f"print(Out[{n_main}], Out[{n_sub}], repr(_i{n_sub}))")[1]).strip()
    assert check == "main sub \"'sub'\""


def test_top_level_await_in_a_subshell(wire: Wire, subshell: str) -> None:
    reply, outputs = wire.run(
        "t0 = trio.current_time()\nawait trio.sleep(0.1)\nprint(trio.current_time() - t0 >= 0.1, "
        "trio.lowlevel.current_root_task() is not None)",
        subshell,
    )
    assert reply["content"]["status"] == "ok", reply["content"]
    assert stdout(outputs).strip() == "True True"


def test_nursery_start_soon_from_a_subshell_runs_in_the_main_run(wire: Wire, subshell: str) -> None:
    code = (
        "async def where():\n"
        "    print('task on main thread:', threading.current_thread() is threading.main_thread())\n"
        "nursery.start_soon(where)\n"
    )
    msg_id = wire.execute(code, subshell)
    assert wire.reply(msg_id)["content"]["status"] == "ok"
    wire.wait_printed(msg_id, "task on main thread: True")


def test_completions_in_two_subshells_at_once_all_succeed(wire: Wire) -> None:
    """complete_request on two subshells at once (their own threads), 60
    each, pipelined: every reply is ok. IPython's provisionalcompleter()
    swaps the process's warning filters, and without a lock one thread's
    exit made the other's completion fail with ProvisionalCompleterWarning
    (about 2 in 300 on a 2-core machine, found in review)."""
    subs = [wire.create() for _ in range(2)]
    try:
        sent = [
            wire.send("complete_request", {"code": "import o", "cursor_pos": 8}, sid) for _ in range(60) for sid in subs
        ]
        replies = [wire.reply(m, timeout=60) for m in sent]
        failed = [r["content"] for r in replies if r["content"]["status"] != "ok"]
        assert failed == []
        assert all("os" in r["content"]["matches"] for r in replies)
    finally:
        for sid in subs:
            wire.delete(sid)


def test_stop_on_error_is_per_subshell(wire: Wire) -> None:
    """ipykernel's test_execute_stop_on_error: a failure aborts the queue of
    its own subshell only."""
    a, b = wire.create(), wire.create()
    failing = wire.execute("await trio.sleep(0.3); raise ValueError('x')", a)
    queued = [wire.execute("print('hello')", a), wire.execute("print('goodbye')", a)]
    other = [wire.execute("time.sleep(0.5)", b), wire.execute("print('other')", b)]
    main = wire.execute("print('main')")
    assert wire.reply(failing)["content"]["status"] == "error"
    for msg_id in queued:
        content = wire.reply(msg_id)["content"]
        assert (content["status"], content["ename"]) == ("error", "ExecutionAborted")
    assert [wire.reply(m)["content"]["status"] for m in [*other, main]] == ["ok", "ok", "ok"]
    assert wire.run("print('again')", a)[0]["content"]["status"] == "ok"  # the window closed
    wire.delete(a)
    wire.delete(b)


def test_stdin_per_subshell(wire: Wire, subshell: str) -> None:
    main = wire.execute("print('main got', input('main? '))", allow_stdin=True)
    sub = wire.execute("print('sub got', input('sub? '))", subshell, allow_stdin=True)
    asked = {}
    deadline = time.monotonic() + TIMEOUT
    while len(asked) < 2:
        req = wire.kc.get_stdin_msg(timeout=max(0.1, deadline - time.monotonic()))
        asked[req["content"]["prompt"]] = req
    assert asked["sub? "]["parent_header"]["subshell_id"] == subshell
    assert "subshell_id" not in asked["main? "]["parent_header"]
    for prompt, answer in (("sub? ", "S"), ("main? ", "M")):  # answered in the other order
        reply = wire.kc.session.msg("input_reply", {"value": answer}, parent=asked[prompt])
        wire.kc.stdin_channel.send(reply)
    assert (wire.reply(sub)["content"]["status"], wire.reply(main)["content"]["status"]) == ("ok", "ok")
    assert stdout(wire.outputs(sub)).strip() == "sub got S"
    assert stdout(wire.outputs(main)).strip() == "main got M"
    # input() is back to "not supported" for requests without allow_stdin
    assert wire.run("input()", subshell)[0]["content"]["ename"] == "StdinNotImplementedError"


# -- deleting, interrupting, shutting down ---------------------------------------------------
def test_deleting_a_busy_subshell(wire: Wire) -> None:
    subshell_id = wire.create()
    wire.run("go_on = threading.Event()")
    running = wire.execute("print('SLEEPING', flush=True); go_on.wait(120); print('finished')", subshell_id)
    queued = wire.execute("print('never')", subshell_id)
    wire.wait_printed(running, "SLEEPING")
    # answered while its cell still waits (released only below), not after it
    assert wire.delete(subshell_id) == {"status": "ok"}
    assert subshell_id not in wire.list()
    wire.run("go_on.set()")
    assert wire.reply(running)["content"]["status"] == "ok"  # the current request ends normally
    assert "finished" in stdout(wire.outputs(running))
    content = wire.reply(queued)["content"]
    assert (content["status"], content["ename"]) == ("error", "SubshellDeleted")
    # its thread ends after that request
    deadline = time.monotonic() + TIMEOUT
    code = f"print(any(t.name.endswith({subshell_id!r}) for t in threading.enumerate()))"
    while stdout(wire.run(code)[1]).strip() != "False":
        assert time.monotonic() < deadline, "the deleted subshell's thread did not end"


@pytest.mark.parametrize("fresh", ["message", "signal"], indirect=True)
def test_interrupt_reaches_main_and_busy_subshells(fresh: tuple[KernelManager, Wire]) -> None:
    """interrupt_request (message mode) and SIGINT (signal mode) alike."""
    km, w = fresh
    w.run("import time, trio")
    sync_id, async_id, idle_id = w.create(), w.create(), w.create()
    # cells that would outlast the test: a reply at all is the interrupt's (no wall-clock bound, issue 26)
    main = w.execute("print('M', flush=True); time.sleep(600)")
    spin = w.execute("print('S', flush=True)\nwhile True: pass", sync_id)
    wait = w.execute("print('A', flush=True); await trio.sleep(600)", async_id)
    for msg_id, marker in ((main, "M"), (spin, "S"), (wait, "A")):
        w.wait_printed(msg_id, marker)
    t0 = time.monotonic()
    km.interrupt_kernel()
    for msg_id in (main, spin, wait):
        content = w.reply(msg_id, timeout=TIMEOUT)["content"]
        assert (content["status"], content["ename"]) == ("error", "KeyboardInterrupt"), content
    elapsed = time.monotonic() - t0
    # every lane keeps serving, the idle subshell was not disturbed
    for sid in (None, sync_id, async_id, idle_id):
        assert w.run("1", sid)[0]["content"]["status"] == "ok"
    print(f"\ninterrupt of main + 2 busy subshells answered in {elapsed * 1000:.0f} ms")


FINALIZERS = {
    # a __del__ is waited out before the raise (userrun.thread_in_finalizer)
    "del": [
        "class Slow:",
        "    def __del__(self):",
        "        print('in finalizer', flush=True)",
        "        end = time.monotonic() + 1.0",
        "        while time.monotonic() < end: pass",
        "obj = Slow()",
        "del obj",
    ],
    # a weakref callback is not seen; the interrupt lost in it is raised again (userrun._unraisable)
    "weakref": [
        "import weakref",
        "class T: pass",
        "def slow(_ref):",
        "    print('in finalizer', flush=True)",
        "    end = time.monotonic() + 1.0",
        "    while time.monotonic() < end: pass",
        "obj = T()",
        "ref = weakref.ref(obj, slow)",
        "del obj",
    ],
}


@pytest.mark.parametrize("kind", list(FINALIZERS))
def test_an_interrupt_while_a_subshell_runs_a_finalizer_stops_the_code_after_it(
    fresh: tuple[KernelManager, Wire], kind: str
) -> None:
    """The second stage raises KeyboardInterrupt asynchronously; raised
    inside a finalizer, Python prints and drops it and the cell ran on to
    its end. Now it waits out a ``__del__``, and one lost in another kind
    of finalizer is raised again once that is over."""
    km, w = fresh
    sid = w.create()
    cell = "\n".join(
        [
            "import time",
            *FINALIZERS[kind],
            "end = time.monotonic() + 20",
            "while time.monotonic() < end: pass",
            "print('ran on')",
        ]
    )
    msg_id = w.execute(cell, sid)
    w.wait_printed(msg_id, "in finalizer")
    km.interrupt_kernel()
    content = w.reply(msg_id, timeout=15)["content"]
    assert (content["status"], content.get("ename")) == ("error", "KeyboardInterrupt"), content
    assert w.run("1", sid)[0]["content"]["status"] == "ok"


def test_a_user_hook_that_chains_to_the_kernels_still_works_after_a_subshell_starts(
    fresh: tuple[KernelManager, Wire],
) -> None:
    """The usual ``old = sys.unraisablehook; sys.unraisablehook = mine``
    (``mine`` calls ``old``): a subshell's run put the kernel's hook in
    front again, chained behind ``mine``, and every unraisable exception
    then recursed until RecursionError (found by review)."""
    _km, w = fresh
    setup = "\n".join(
        [
            "import sys",
            "calls = []",
            "old = sys.unraisablehook",
            "def mine(u):",
            "    calls.append(type(u.exc_value).__name__)",
            "    old(u)",
            "sys.unraisablehook = mine",
        ]
    )
    assert w.run(setup)[0]["content"]["status"] == "ok"
    sid = w.create()
    assert w.run("1", sid)[0]["content"]["status"] == "ok"  # its run is up
    trigger = "\n".join(["class D:", "    def __del__(self): 1 / 0", "d = D()", "del d", "len(calls)"])
    reply, out = w.run(trigger)
    assert reply["content"]["status"] == "ok", reply["content"]
    results = [m["content"]["data"]["text/plain"] for m in out if m["msg_type"] == "execute_result"]
    assert results == ["1"], (results, [m["content"] for m in out if m["msg_type"] == "stream"])


def test_shutdown_with_busy_subshells(fresh: tuple[KernelManager, Wire]) -> None:
    """One subshell ends within the grace, the two others (awaiting, spinning)
    are interrupted after it; the kernel exits 0."""
    km, w = fresh
    ids = [w.create() for _ in range(3)]
    running = [
        w.execute("import time; print('A', flush=True); time.sleep(0.5)", ids[0]),
        w.execute("import trio; print('B', flush=True); await trio.sleep(60)", ids[1]),
        w.execute("print('C', flush=True)\nwhile True: pass", ids[2]),
    ]
    for msg_id, marker in zip(running, "ABC", strict=True):
        w.wait_printed(msg_id, marker)
    proc = km.provisioner.process  # type: ignore[union-attr]
    t0 = time.monotonic()
    msg = w.kc.session.msg("shutdown_request", {"restart": False})
    w.kc.control_channel.send(msg)
    assert w.kc.get_control_msg(timeout=TIMEOUT)["content"]["status"] == "ok"
    code = proc.wait(timeout=60)
    elapsed = time.monotonic() - t0
    assert code == 0, code
    print(f"\nshutdown with 3 busy subshells: exit 0 after {elapsed:.2f} s")
