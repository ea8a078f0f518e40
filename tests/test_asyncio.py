"""asyncio and trio in the same notebook (issue 24), on real kernels through jupyter_client. Tier 3.

The issue's "Done when" list, one test (or a few) each, in its order; then
the places cells run (subshells, %time / %timeit), the switch
(``%autoawait``, ``--autoawait``) and sync cells. Waiting is on what the
kernel publishes (a tick printed, a reply), with deadlines; the only timed
assertions are the issue's own (a 0.1 + 0.1 s cell takes 0.2 s ± 0.1, an
interrupt's reply within 1 s). The mechanism's own cases are in
tests/test_aiodrive.py; the debugger's in tests/test_aio_debugger.py.
"""

from __future__ import annotations

import re
import textwrap
import time
from typing import TYPE_CHECKING, Any

import pytest
from conftest import TIMEOUT, make_kernelspec, start_kernel, stdout_of, stop_kernel
from test_subshells import Wire, stdout

if TYPE_CHECKING:
    from collections.abc import Iterator

    from jupyter_client.manager import KernelManager

pytestmark = pytest.mark.timeout(180)

#: the issue's bound: an interrupted ``await asyncio.sleep(30)`` replies within this
INTERRUPT_BUDGET = 1.0

TICKER = """
import asyncio
ticks = []
async def ticker():
    while True:
        ticks.append(len(ticks))
        print("tick", len(ticks))
        await asyncio.sleep(0.05)
task = asyncio.create_task(ticker())
"""

F42 = """
import asyncio
async def f():
    await asyncio.sleep(0.05)
    return 42
"""

TICK_RE = re.compile(r"tick (\d+)")


def code(src: str) -> str:
    return textwrap.dedent(src).strip("\n") + "\n"


def ok(wire: Wire, src: str, subshell_id: str | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    reply, out = wire.run(code(src), subshell_id)
    c = reply["content"]
    errors = [m["content"] for m in out if m["msg_type"] == "error"]
    assert c["status"] == "ok", (c.get("ename"), c.get("evalue"), errors)
    return c, out


def result(out: list[dict[str, Any]]) -> str:
    res = [m["content"]["data"]["text/plain"] for m in out if m["msg_type"] == "execute_result"]
    assert len(res) == 1, out
    return str(res[0])


def error(wire: Wire, src: str) -> dict[str, Any]:
    reply, _out = wire.run(code(src))
    c = reply["content"]
    assert c["status"] == "error", c
    return dict(c)


def ticks_of(wire: Wire, msg_id: str) -> list[int]:
    """The ticks printed so far under request ``msg_id`` (also after its idle)."""
    return [int(n) for n in TICK_RE.findall(stdout(wire.iopub.get(msg_id, [])))]


def wait_ticks(wire: Wire, msg_id: str, above: int, timeout: float = TIMEOUT) -> int:
    """Read IOPub until a tick above ``above`` is printed under ``msg_id``; the highest so far."""
    deadline = time.monotonic() + timeout
    while not any(t > above for t in ticks_of(wire, msg_id)):
        msg = wire.kc.get_iopub_msg(timeout=max(0.05, deadline - time.monotonic()))
        wire.iopub.setdefault(msg["parent_header"].get("msg_id", ""), []).append(msg)
    return max(ticks_of(wire, msg_id))


def start_ticker(wire: Wire) -> str:
    msg_id = wire.execute(code(TICKER))
    assert wire.reply(msg_id)["content"]["status"] == "ok"
    wait_ticks(wire, msg_id, 0)
    return msg_id


@pytest.fixture(scope="module")
def wire(jupyter_path: str) -> Iterator[Wire]:
    km, kc = start_kernel("trikernel-test-signal")
    yield Wire(kc)
    stop_kernel(km, kc)


@pytest.fixture(params=["signal", "message"], scope="module")
def mode_wire(request: pytest.FixtureRequest, jupyter_path: str) -> Iterator[tuple[KernelManager, Wire]]:
    km, kc = start_kernel(f"trikernel-test-{request.param}")
    yield km, Wire(kc)
    stop_kernel(km, kc)


@pytest.fixture
def fresh(jupyter_path: str) -> Iterator[tuple[KernelManager, Wire]]:
    km, kc = start_kernel("trikernel-test-signal")
    yield km, Wire(kc)
    stop_kernel(km, kc)


# ---------------------------------------------------------------- the issue's table


def test_the_issues_six_cells_give_what_ipykernel_users_expect(fresh):
    """Row by row: the print after 0.2 s; 42; a Task that keeps running; [42, 42];
    trio's sleep runs; asyncio.run in a sync cell gives 42 (ipykernel refuses it)."""
    _km, wire = fresh
    _c, out = ok(
        wire,
        """
        import asyncio, time
        t0 = time.monotonic()
        await asyncio.sleep(0.2)
        print('slept', time.monotonic() - t0 >= 0.2)
        """,
    )
    assert stdout(out) == "slept True\n"
    ok(wire, F42)
    _c, out = ok(wire, "await f()")
    assert result(out) == "42"
    _c, out = ok(wire, "task = asyncio.create_task(f())\ntask")
    assert result(out).startswith("<Task pending name='Task-"), result(out)
    assert "coro=<f()" in result(out), result(out)
    _c, out = ok(wire, "await task, task.done()")
    assert result(out) == "(42, True)"
    _c, out = ok(wire, "await asyncio.gather(f(), f())")
    assert result(out) == "[42, 42]"
    _c, out = ok(wire, "import trio\nawait trio.sleep(0.01)\nprint('trio slept')")
    assert stdout(out) == "trio slept\n"
    _c, out = ok(wire, "asyncio.run(f())")
    assert result(out) == "42"


def test_one_cell_awaits_both_and_prints_once(wire):
    _c, out = ok(
        wire,
        """
        import asyncio, time, trio
        t0 = time.monotonic()
        await asyncio.sleep(0.1); await trio.sleep(0.1)
        print(f"took {time.monotonic() - t0:.3f}")
        """,
    )
    streams = [m for m in out if m["msg_type"] == "stream"]
    assert len(streams) == 1, streams
    took = float(stdout(out).split()[1])
    assert 0.1 <= took <= 0.3, took  # the issue's 0.2 s ± 0.1


# ---------------------------------------------------------------- one loop for the kernel's life


def test_a_task_runs_while_idle_and_during_later_cells_and_prints_to_its_cell(fresh):
    _km, wire = fresh
    ticker_cell = start_ticker(wire)  # a sync cell: create_task schedules on the kernel's loop
    wait_ticks(wire, ticker_cell, 5)  # the kernel is idle meanwhile
    _c, out = ok(wire, "len(ticks)")
    assert int(result(out)) >= 5
    _c, out = ok(wire, "n = len(ticks)\nawait asyncio.sleep(0.2)\nlen(ticks) > n")  # it ticks while a cell awaits
    assert result(out) == "True"
    ok(wire, "task.cancel(); await asyncio.sleep(0)\nstopped_at = len(ticks)")
    _c, out = ok(wire, "await asyncio.sleep(0.2)\n(task.cancelled(), len(ticks) == stopped_at)")
    assert result(out) == "(True, True)"
    # every tick, also those printed while later cells ran, is the first cell's output
    later = [m for mid, msgs in wire.iopub.items() if mid != ticker_cell for m in msgs]
    assert not TICK_RE.search(stdout(later)), stdout(later)
    assert len(ticks_of(wire, ticker_cell)) >= 5


# ---------------------------------------------------------------- asyncio libraries


def test_streams_aiohttp_subprocess_queue(wire):
    """Servers started in one cell answer in the next (asyncio streams; aiohttp's web
    server and client; httpx on anyio); a subprocess; an asyncio.Queue fed by an
    asyncio task and drained by a trikernel.nursery trio task."""
    ok(
        wire,
        """
        import asyncio
        async def upper(reader, writer):
            writer.write((await reader.read(100)).upper())
            await writer.drain()
            writer.close()
        server = await asyncio.start_server(upper, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        """,
    )
    _c, out = ok(
        wire,
        """
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"abc"); await writer.drain()
        data = await reader.read(100)
        writer.close(); await writer.wait_closed()
        data
        """,
    )
    assert result(out) == "b'ABC'"
    ok(
        wire,
        """
        from aiohttp import web
        async def hello(request):
            return web.Response(text="payload from aiohttp")
        app = web.Application()
        app.router.add_get("/", hello)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        web_port = site._server.sockets[0].getsockname()[1]
        """,
    )
    _c, out = ok(
        wire,
        """
        import aiohttp
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{web_port}/") as response:
                text = await response.text()
        text
        """,
    )
    assert result(out) == "'payload from aiohttp'"
    _c, out = ok(
        wire,
        "import httpx\nasync with httpx.AsyncClient() as c:\n    r = await c.get(f'http://127.0.0.1:{web_port}/')\nr.text",
    )
    assert result(out) == "'payload from aiohttp'"
    _c, out = ok(
        wire,
        """
        p = await asyncio.create_subprocess_exec("echo", "hi", stdout=asyncio.subprocess.PIPE)
        (await p.communicate())[0]
        """,
    )
    assert result(out) == "b'hi\\n'"
    _c, out = ok(
        wire,
        """
        import trio
        q = asyncio.Queue()
        drained, done = [], trio.Event()
        async def produce():
            for i in range(5):
                await q.put(i)
                await asyncio.sleep(0.01)
            await q.put(None)
        async def drain():  # a trio task of trikernel.nursery awaiting asyncio
            while (item := await q.get()) is not None:
                drained.append(item)
            done.set()
        producer = asyncio.create_task(produce())
        nursery.start_soon(drain)
        await done.wait()
        drained
        """,
    )
    assert result(out) == "[0, 1, 2, 3, 4]"
    ok(wire, "await runner.cleanup(); server.close(); await server.wait_closed()")


# ---------------------------------------------------------------- interrupts


def interrupt(km: KernelManager, wire: Wire, src: str) -> tuple[float, dict[str, Any]]:
    """Run ``src`` (it prints 'waiting', then blocks), interrupt it: the KeyboardInterrupt
    reply's delay after the interrupt, and the reply's content."""
    msg_id = wire.execute(code(src))
    wire.wait_printed(msg_id, "waiting")
    t0 = time.monotonic()
    km.interrupt_kernel()
    reply = wire.reply(msg_id)
    latency = time.monotonic() - t0
    c = reply["content"]
    assert (c["status"], c.get("ename")) == ("error", "KeyboardInterrupt"), c
    wire.outputs(msg_id)
    print(f"interrupt latency: {latency * 1000:.0f} ms")
    return latency, dict(c)


def test_an_interrupt_ends_an_awaiting_cell_and_earlier_tasks_tick_on(mode_wire):
    km, wire = mode_wire
    # the kernel's first traceback loads IPython's formatter (pygments' lexers:
    # 0.15 s of the 0.43 s a first asyncio traceback takes alone, whatever
    # raised it; docs/benchmarks.md): not this interrupt's cost
    error(wire, "raise ValueError('the first traceback')")
    ticker_cell = start_ticker(wire)
    latency, c = interrupt(km, wire, "print('waiting')\nawait asyncio.sleep(30)")
    assert latency < INTERRUPT_BUDGET, f"{latency:.2f}s"
    # the cell's line, asyncio's own frame; no trio-asyncio frame, nor the CancelledError
    # of the future the interrupt cancelled (the mechanism's, not the user's)
    tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(c["traceback"]))
    assert "----> 2 await asyncio.sleep(30)" in tb, tb
    assert "asyncio/tasks.py" in tb, tb
    assert "trio_asyncio" not in tb, tb
    assert "CancelledError" not in tb, tb
    ok(
        wire,
        """
        async def silent(reader, writer):
            await reader.read()  # never answers
        mute = await asyncio.start_server(silent, "127.0.0.1", 0)
        mute_port = mute.sockets[0].getsockname()[1]
        """,
    )
    # also a request that never gets an answer; no bound on this reply: IPython's
    # formatting of aiohttp's eight frames alone took 0.15-0.8 s on the loaded
    # 2-core test machine (docs/benchmarks.md), the interrupt itself a few ms
    interrupt(
        km,
        wire,
        """
        import aiohttp
        async with aiohttp.ClientSession() as s:
            print('waiting')
            await s.get(f"http://127.0.0.1:{mute_port}/")
        """,
    )
    last = max(ticks_of(wire, ticker_cell))
    wait_ticks(wire, ticker_cell, last + 2)  # the earlier cell's task still ticks
    ok(wire, "task.cancel(); mute.close()")


# ---------------------------------------------------------------- errors


def test_an_unawaited_tasks_error_is_written_to_its_cells_stderr(wire):
    """As ipykernel shows it (asyncio logs it; logging's last resort writes it to
    sys.stderr): stderr text of the cell that made the task, never an ``error``
    output, which says that cell raised (papermill fails a notebook for any)."""
    msg_id = wire.execute(
        code(
            """
            import asyncio
            async def bg():
                await asyncio.sleep(0.05)
                raise ValueError('bg')
            asyncio.create_task(bg())
            print('started')
            """
        )
    )
    assert wire.reply(msg_id)["content"]["status"] == "ok"
    deadline = time.monotonic() + TIMEOUT
    while "ValueError: bg" not in stdout_of(wire.iopub.get(msg_id, []), "stderr"):
        msg = wire.kc.get_iopub_msg(timeout=max(0.05, deadline - time.monotonic()))
        wire.iopub.setdefault(msg["parent_header"].get("msg_id", ""), []).append(msg)
    assert not [m for m in wire.iopub[msg_id] if m["msg_type"] == "error"]
    tb = stdout_of(wire.iopub[msg_id], "stderr")
    assert tb.startswith("Task exception was never retrieved\nfuture: <Task finished name='Task-"), tb
    assert "Traceback (most recent call last):\n" in tb, tb
    assert "raise ValueError('bg')" in tb, tb
    ok(wire, "1 + 1")  # and the kernel serves on


def test_asyncio_run_and_nest_asyncio(fresh):
    _km, wire = fresh
    ok(wire, F42)
    _c, out = ok(wire, "asyncio.run(f())")
    assert result(out) == "42"
    c = error(wire, "import nest_asyncio\nnest_asyncio.apply()\nasyncio.get_event_loop().run_until_complete(f())")
    assert c["ename"] == "KernelLoopError", c
    assert "`await f()`" in c["evalue"], c
    _c, out = ok(wire, "await f()")
    assert result(out) == "42"


def test_shutdown_cancels_pending_tasks_and_their_finally_blocks_run(jupyter_path, tmp_path):
    km, kc = start_kernel("trikernel-test-signal")
    wire = Wire(kc)
    plain, awaiting = tmp_path / "plain.txt", tmp_path / "awaiting.txt"
    try:
        ok(
            wire,
            f"""
            import asyncio
            async def pending(path, wait):
                try:
                    await asyncio.sleep(1000)
                finally:
                    if wait:
                        await asyncio.sleep(0.05)  # a finally block may await
                    open(path, "w").write("finally ran")
            t1 = asyncio.create_task(pending({str(plain)!r}, False))
            t2 = asyncio.create_task(pending({str(awaiting)!r}, True))
            await asyncio.sleep(0)
            """,
        )
    finally:
        kc.stop_channels()
    process = km.provisioner.process  # type: ignore[union-attr]
    km.shutdown_kernel(now=False)
    assert process.wait(timeout=TIMEOUT) == 0
    assert plain.read_text() == "finally ran"
    assert awaiting.read_text() == "finally ran"


# ---------------------------------------------------------------- everywhere cells run


def test_each_subshell_has_a_loop_and_reaches_the_main_one(wire):
    ok(wire, "import asyncio\nmain_loop = asyncio.get_event_loop()")
    subshell = wire.create()
    try:
        _c, out = ok(
            wire,
            """
            import threading
            mine = asyncio.get_running_loop()
            t = asyncio.create_task(asyncio.sleep(0.01, "sub task"))
            (mine is not main_loop, threading.current_thread().name.startswith("trikernel-subshell-"), await t)
            """,
            subshell,
        )
        assert result(out) == "(True, True, 'sub task')"
        _c, out = ok(
            wire,
            """
            cf = asyncio.run_coroutine_threadsafe(asyncio.sleep(0.01, "from the main loop"), main_loop)
            await asyncio.wrap_future(cf)
            """,
            subshell,
        )
        assert result(out) == "'from the main loop'"
        _c, out = ok(wire, "asyncio.run(asyncio.sleep(0, 'run in a subshell'))", subshell)
        assert result(out) == "'run in a subshell'"
    finally:
        wire.delete(subshell)


def test_time_and_timeit_await_asyncio(wire):
    _c, out = ok(wire, "import asyncio, trio\n%time await asyncio.sleep(0.05)")
    assert "Wall time" in stdout(out)
    _c, out = ok(wire, "%timeit -n 5 -r 2 await asyncio.sleep(0)")
    assert "per loop" in stdout(out)
    _c, out = ok(wire, "%%time\nawait trio.sleep(0.01)\nawait asyncio.sleep(0.01)")
    assert "Wall time" in stdout(out)
    _c, out = ok(wire, "x = %time await asyncio.sleep(0, 'value')\nx")
    assert result(out) == "'value'"


# ---------------------------------------------------------------- sync cells


def test_a_sync_cell_runs_with_no_running_loop(wire):
    """As plain Python: get_running_loop() raises (so asyncio.run works); get_event_loop()
    is the kernel's loop, where create_task schedules."""
    _c, out = ok(
        wire,
        """
        import asyncio
        try:
            asyncio.get_running_loop()
            running = "a loop runs"
        except RuntimeError as e:
            running = str(e)
        (running, type(asyncio.get_event_loop()).__name__)
        """,
    )
    assert result(out) == "('no running event loop', 'TrioEventLoop')"
    _c, out = ok(wire, "loop = asyncio.get_running_loop()\nawait asyncio.sleep(0)\nloop is asyncio.get_event_loop()")
    assert result(out) == "True"  # a cell that awaits runs inside the loop: every statement of it


# ---------------------------------------------------------------- the switch


def test_autoawait_trio_is_pure_trio_and_asyncio_brings_both_back(wire):
    _c, out = ok(wire, "%autoawait")
    assert stdout(out) == (
        "IPython autoawait is `on`, and set to use `asyncio`: cells may await asyncio and trio alike\n"
    )
    ok(wire, "%autoawait trio")
    try:
        _c, out = ok(wire, "%autoawait")
        assert "set to use `trio`" in stdout(out)
        ok(wire, "import trio\nawait trio.sleep(0)")
        # no running asyncio loop for the cell (as a sync cell), and trio refuses asyncio's yields
        c = error(wire, "import asyncio\nawait asyncio.sleep(0.01)")
        assert (c["ename"], c["evalue"]) == ("RuntimeError", "no running event loop"), c
        c = error(wire, "await asyncio.sleep(0)")
        assert c["ename"] == "TypeError", c
        assert "unrecognized yield message" in c["evalue"], c
    finally:
        ok(wire, "%autoawait asyncio")
    ok(wire, "await asyncio.sleep(0.01)")


def test_the_kernel_option_sets_the_default(jupyter_path, tmp_path):
    make_kernelspec(jupyter_path, "trikernel-test-autoawait-trio", extra_argv=["--autoawait", "trio"])
    km, kc = start_kernel("trikernel-test-autoawait-trio")
    try:
        wire = Wire(kc)
        _c, out = ok(wire, "%autoawait")
        assert "set to use `trio`" in stdout(out)
        c = error(wire, "import asyncio\nawait asyncio.sleep(0)")
        assert c["ename"] == "TypeError", c
        ok(wire, "%autoawait on")
        ok(wire, "await asyncio.sleep(0)")
    finally:
        stop_kernel(km, kc)


def test_a_thread_that_completes_an_asyncio_future_neither_kills_the_kernel_nor_loses_the_result(
    fresh: tuple[KernelManager, Wire],
) -> None:
    """asyncio leaves ``fut.set_result`` (``loop.call_soon``) from another thread undefined; on the
    kernel's loop it reached trio's memory channel from a foreign thread and killed the kernel
    with TrioInternalError (ipykernel's test_comm_reply_follows_requesting_subshell: a comm
    callback on a subshell's thread completing the main cell's future). Such calls now hop
    to the loop's thread, as call_soon_threadsafe does: the cell gets its result."""
    km, wire = fresh
    _, out = ok(
        wire,
        """
        import asyncio, threading
        got = []
        for i in range(5):
            fut = asyncio.get_running_loop().create_future()
            threading.Timer(0.05, fut.set_result, args=(i,)).start()  # while the loop sleeps
            got.append(await asyncio.wait_for(fut, 30))
        got == list(range(5))
        """,
    )
    assert result(out) == "True"
    _, out = ok(wire, "await asyncio.sleep(0.01); 'alive'")
    assert result(out) == "'alive'"
    assert km.is_alive()
