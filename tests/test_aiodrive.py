"""asyncio beside trio, below the kernel (issue 24): the driver, the loop, sync cells. Tier 2.

Each case runs in a fresh interpreter (``run_case``): importing trio-asyncio
changes asyncio for the whole process (its event loop policy), and several
stock cases corrupt trio on purpose, so none of it may run in the test
process, whose jupyter_client makes asyncio loops of its own. A case is a
body ``async def body(loop)`` awaited in a trio run inside
``aioloop.open_kernel_loop``, as the user run's main task does; ``cell(coro)``
awaits a coroutine as a cell that awaits (the driver); the body's own code
is a sync cell's (the cells task's code the driver does not step). Results
come back as JSON.

The ``stock_*`` cases keep the evidence behind the mechanism
(docs/trio.md, "asyncio beside trio"): what trio-asyncio's own
``allow_asyncio`` and its stock tasks do with the same code.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)

PRELUDE = """
import asyncio, contextvars, gc, json, signal, sys, threading, time
import sniffio, trio, trio_asyncio
from trikernel.user import aiodrive, aioloop, aiosync
from trikernel.user.outstream import current_request

RESULTS = {}
REPORTED = []

def put(key, value):
    RESULTS[key] = value

def _shown(context):
    obj = context.get("future") or context.get("task")
    REPORTED.append([context.get("message"), repr(context.get("exception")), getattr(obj, "_trikernel_request", None)])
    return True

aioloop._show_in_cell = _shown  # no shell here: record what would be shown, and for which request

async def cell(coro):
    return await aiodrive.run_mixed(coro, trio_asyncio.current_loop.get(), interruptible=True)

async def _main():
    aiosync.install()
    async with aioloop.open_kernel_loop(GRACE) as loop:
        await body(loop)

GRACE = 1.0
"""

RUN = """
try:
    trio.run(_main)
finally:
    RESULTS.setdefault("reported", REPORTED)
    print("RESULTS " + json.dumps(RESULTS, default=repr), flush=True)
"""

STOCK_RUN = """
try:
    trio.run(_stock)
finally:
    print("RESULTS " + json.dumps(RESULTS, default=repr), flush=True)
"""


def run_case(body: str, *, stock: bool = False, timeout: float = 60) -> dict[str, Any]:
    """Run ``body`` (defining ``body(loop)``, or ``_stock()`` with ``stock``) after the prelude
    in a fresh interpreter; return what it ``put``."""
    src = PRELUDE + textwrap.dedent(body) + (STOCK_RUN if stock else RUN)
    p = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULTS ")]
    assert lines, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    results: dict[str, Any] = json.loads(lines[-1][len("RESULTS ") :])
    results["_stderr"] = p.stderr
    results["_exit"] = p.returncode
    return results


# -------------------------------------------------------------------------- evidence


def test_stock_allow_asyncio_cannot_sleep0_nor_time_out_but_the_driver_can():
    """trio_asyncio.allow_asyncio gives trio asyncio.sleep(0)'s bare yield and has no
    current task (asyncio.timeout refuses); the driver does both."""
    stock = run_case(
        """
        async def _stock():
            async with trio_asyncio.open_loop():
                async def sleep0():
                    await asyncio.sleep(0)
                async def timeout():
                    async with asyncio.timeout(1):
                        await asyncio.sleep(0.01)
                for name, fn in (("sleep0", sleep0), ("timeout", timeout)):
                    try:
                        await trio_asyncio.allow_asyncio(fn)
                        put(name, "ok")
                    except BaseException as e:
                        put(name, f"{type(e).__name__}: {e}")
        """,
        stock=True,
    )
    assert stock["sleep0"].startswith("TypeError: trio.run received unrecognized yield message None"), stock
    assert stock["timeout"] == "RuntimeError: Timeout should be used inside a task", stock
    ours = run_case(
        """
        async def body(loop):
            async def c():
                await asyncio.sleep(0)
                async with asyncio.timeout(1):
                    await asyncio.sleep(0.01)
                return type(asyncio.current_task()).__name__
            put("cell", await cell(c()))
        """
    )
    assert ours["cell"] == "CellTask", ours


def test_stock_task_that_calls_trio_corrupts_trio_but_a_mixed_task_does_not():
    """trio-asyncio steps every stock task in its one loop task: two tasks that await
    trio interleave their cancel scopes there. Mixed tasks each have a trio task."""
    stock = run_case(
        """
        async def uses_trio():
            await asyncio.sleep(0.01)
            await trio.sleep(0.01)
        async def _stock():
            try:
                async with trio_asyncio.open_loop() as loop:
                    a, b = loop.create_task(uses_trio()), loop.create_task(uses_trio())
                    await trio.sleep(0.1)
                    put("a", repr(a.exception()) if a.done() else "pending")
            except BaseException as e:
                put("run", repr(e)[:200])
        """,
        stock=True,
    )
    seen = stock["_stderr"] + str(stock.get("a")) + str(stock.get("run"))
    assert "Cancel scope stack corrupted" in seen, stock
    ours = run_case(
        """
        async def body(loop):
            async def uses_trio(x):
                await asyncio.sleep(0.01)
                await trio.sleep(0.01)
                return x, sniffio.current_async_library()
            async def c():
                return await asyncio.gather(uses_trio(1), uses_trio(2))
            put("gather", await cell(c()))
        """
    )
    assert ours["gather"] == [[1, "trio"], [2, "trio"]], ours
    assert "corrupted" not in ours["_stderr"], ours["_stderr"]


def test_cancellation_crosses_both_ways():
    """asyncio cancels a trio wait (CellTask.cancel, asyncio.timeout, TaskGroup); trio
    cancels an asyncio wait (a cancel scope); an asyncio task's cancel reaches the trio
    wait it is blocked in, and the task may catch it."""
    r = run_case(
        """
        async def body(loop):
            async def c():
                out = {}
                me = asyncio.current_task()
                asyncio.get_running_loop().call_later(0.02, me.cancel)
                try:
                    await trio.sleep(5)
                except asyncio.CancelledError:
                    out["cell_cancel_over_trio"] = me.uncancel() == 0
                try:
                    async with asyncio.timeout(0.02):
                        await trio.sleep(5)
                except TimeoutError:
                    out["timeout_over_trio"] = True
                with trio.move_on_after(0.02) as scope:
                    await asyncio.sleep(5)
                out["trio_scope_over_asyncio"] = scope.cancelled_caught
                async def bad():
                    await trio.sleep(0.01)
                    raise ValueError("x")
                try:
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(bad())
                        await trio.sleep(5)
                except* ValueError:
                    out["taskgroup_cancels_trio_wait"] = True
                async def catches():
                    try:
                        await trio.sleep(5)
                    except asyncio.CancelledError:
                        return "caught"
                t = asyncio.create_task(catches())
                await asyncio.sleep(0.01)
                t.cancel()
                out["task_result_after_cancel"] = await t
                t2 = asyncio.create_task(catches())
                t2.cancel()  # before its first step: the coroutine never starts
                try:
                    await t2
                except asyncio.CancelledError:
                    out["cancelled_before_start"] = t2.cancelled()
                return out
            put("out", await cell(c()))
        """
    )
    assert r["out"] == {
        "cell_cancel_over_trio": True,
        "timeout_over_trio": True,
        "trio_scope_over_asyncio": True,
        "taskgroup_cancels_trio_wait": True,
        "task_result_after_cancel": "caught",
        "cancelled_before_start": True,
    }, r


def test_sniffio_and_contextvars():
    """sniffio says trio in a cell and in a mixed task (anyio then takes its trio
    backend: a trio task drives both), asyncio in a loop callback and in asyncio.run;
    a context variable set in a cell reaches the tasks and threads it starts, and a
    task's own change stays in the task."""
    r = run_case(
        """
        var = contextvars.ContextVar("var", default="unset")
        async def body(loop):
            async def c():
                var.set("cell")
                out = {"cell": sniffio.current_async_library()}
                async def task():
                    seen = var.get()
                    var.set("task")
                    return sniffio.current_async_library(), seen
                out["task"] = await asyncio.create_task(task())
                out["after_task"] = var.get()
                fut = loop.create_future()
                loop.call_soon(lambda: fut.set_result(sniffio.current_async_library()))
                out["callback"] = await fut
                out["to_thread"] = await asyncio.to_thread(var.get)
                out["executor"] = await loop.run_in_executor(None, var.get)
                return out
            put("out", await cell(c()))
            put("sync_cell", sniffio.current_async_library())
            async def m():
                return sniffio.current_async_library()
            put("asyncio_run", asyncio.run(m()))
        """
    )
    assert r["out"] == {
        "cell": "trio",
        "task": ["trio", "cell"],
        "after_task": "cell",
        "callback": "asyncio",
        "to_thread": "cell",
        "executor": "cell",
    }, r
    assert (r["sync_cell"], r["asyncio_run"]) == ("trio", "asyncio"), r


# -------------------------------------------------------------------------- sync cells


def test_a_sync_cell_has_no_running_loop_but_schedules_on_the_kernels():
    r = run_case(
        """
        async def body(loop):
            try:
                asyncio.get_running_loop()
                put("get_running_loop", "returned")
            except RuntimeError as e:
                put("get_running_loop", str(e))
            put("get_event_loop_is_kernels", asyncio.get_event_loop() is loop)
            async def f():
                await asyncio.sleep(0.01)
                return 42
            put("asyncio_run", asyncio.run(f()))
            with asyncio.Runner() as runner:
                put("runner", runner.run(f()))
            nested = asyncio.new_event_loop()
            put("new_event_loop", nested.run_until_complete(f()))
            nested.close()
            put("kernel_loop_kept", asyncio.get_event_loop() is loop)  # Runner's set_event_loop did not replace it
            task = asyncio.create_task(f())
            fut = asyncio.ensure_future(f())
            async def wait(f):
                return await f
            put("task", await cell(wait(task)))
            put("ensure_future", await cell(wait(fut)))
            async def in_cell():
                return asyncio.get_running_loop() is loop
            put("async_cell_sees_loop", await cell(in_cell()))
            # hidden from the cells task only: a callback and another trio task (a comm handler) see it
            seen = loop.create_future()
            loop.call_soon(lambda: seen.set_result(asyncio.get_running_loop() is loop))
            put("callback_sees_loop", await cell(wait(seen)))
            async def other_task(out):
                out.append(asyncio.get_running_loop() is loop)
            other = []
            async with trio.open_nursery() as n:
                n.start_soon(other_task, other)
            put("other_task_sees_loop", other == [True])
            async def run_in_cell():
                try:
                    asyncio.run(f())
                except RuntimeError as e:
                    return str(e)
            put("asyncio_run_in_async_cell", await cell(run_in_cell()))
        """
    )
    assert r["get_running_loop"] == "no running event loop", r
    seen = ("get_event_loop_is_kernels", "kernel_loop_kept", "async_cell_sees_loop", "callback_sees_loop")
    assert [r[k] for k in (*seen, "other_task_sees_loop")] == [True] * 5, r
    assert (r["asyncio_run"], r["runner"], r["new_event_loop"], r["task"], r["ensure_future"]) == (42,) * 5, r
    assert "cannot be called from a running event loop" in r["asyncio_run_in_async_cell"], r


def test_asyncio_run_in_a_worker_thread_gets_a_stock_loop():
    """trio-asyncio makes new_event_loop() outside trio a loop that runs trio itself;
    the kernel gives threads stock asyncio back (trio.md's old workaround keeps working)."""
    r = run_case(
        """
        async def body(loop):
            def in_thread():
                async def g():
                    await asyncio.sleep(0.01)
                    return type(asyncio.get_running_loop()).__name__
                return asyncio.run(g())
            put("loop", await trio.to_thread.run_sync(in_thread))
        """
    )
    assert r["loop"] == "_UnixSelectorEventLoop", r


def test_the_kernel_loop_refuses_to_run_again_and_takes_any_executor():
    r = run_case(
        """
        from concurrent.futures import ThreadPoolExecutor
        async def body(loop):
            async def f():
                return 1
            for name, call in (("run_until_complete", lambda: loop.run_until_complete(f())),
                               ("run_forever", loop.run_forever), ("stop", loop.stop)):
                try:
                    call()
                    put(name, "ran")
                except RuntimeError as e:
                    put(name, type(e).__name__)
            async def c():
                with ThreadPoolExecutor(2) as ex:
                    a = await loop.run_in_executor(ex, sum, [1, 2])
                    loop.set_default_executor(ex)
                    b = await asyncio.to_thread(sum, [3, 4])
                return a, b
            put("executors", await cell(c()))
        """
    )
    assert (r["run_until_complete"], r["run_forever"], r["stop"]) == ("KernelLoopError",) * 3, r
    assert r["executors"] == [3, 7], r


# -------------------------------------------------------------------------- errors, interrupts


def test_an_unawaited_task_error_is_reported_with_its_request_when_collected():
    """asyncio's own semantics: "Task exception was never retrieved" when the Task is
    collected, at once for a task nobody holds (no reference cycle through the driver);
    one that is awaited is not reported."""
    r = run_case(
        """
        async def body(loop):
            async def boom():
                await trio.sleep(0.01)
                raise ValueError("bg")
            async def c():
                current_request.set("cell-1")
                asyncio.create_task(boom())
                held = asyncio.create_task(boom())
                await asyncio.sleep(0.1)
                put("before_await", list(REPORTED))
                try:
                    await held
                except ValueError:
                    pass
            gc.disable()  # the report must not wait for the collector
            await cell(c())
            del c
            put("after", list(REPORTED))
        """
    )
    assert r["before_await"] == [["Task exception was never retrieved", "ValueError('bg')", "cell-1"]], r
    assert r["after"] == r["before_await"], r


def test_keyboard_interrupt_reaches_the_cell_and_the_loop_survives():
    """SIGINT while a stock asyncio task holds the CPU inside the loop's callback (its
    driver is KI-protected) goes to the awaiting cell; a task that raises
    KeyboardInterrupt itself does not end the loop either."""
    r = run_case(
        """
        async def body(loop):
            ticks = []
            async def bg():
                while True:
                    ticks.append(1)
                    await asyncio.sleep(0.005)
            async def hog():
                while True:
                    time.sleep(0.05)
                    await asyncio.sleep(0)
            bgt = loop.create_task(bg())
            hogt = asyncio.Task(hog(), loop=loop)  # a stock task: its steps run in the loop's trio task
            async def c():
                await asyncio.sleep(30)
            threading.Timer(0.2, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)).start()
            try:
                await cell(c())
            except KeyboardInterrupt:
                put("cell", "KeyboardInterrupt")
            hogt.cancel()
            async def raiser():
                raise KeyboardInterrupt
            async def c2():
                t = asyncio.create_task(raiser())
                try:
                    await t
                except RuntimeError as e:
                    return str(e)
            put("task_ki", await cell(c2()))
            n = len(ticks)
            await trio.sleep(0.1)
            put("loop_alive", len(ticks) > n and not bgt.done() and loop.is_running())
        """
    )
    assert r["cell"] == "KeyboardInterrupt", r
    assert "raised KeyboardInterrupt" in r["task_ki"], r
    assert r["loop_alive"], r


def test_keyboard_interrupt_in_a_reader_callback_goes_to_the_cell():
    """trio-asyncio runs a transport's reader callbacks in trio tasks of their own (not
    in its loop driver): a SIGINT landing in one killed the loop and the user run (seen
    interrupting an aiohttp request). Those tasks start KI-protected now."""
    r = run_case(
        """
        import socket
        async def body(loop):
            a, b = socket.socketpair()
            class Slow(asyncio.Protocol):
                def data_received(self, data):
                    put("in_callback", True)
                    time.sleep(0.5)  # the SIGINT lands here
            transport, _ = await cell(loop.create_connection(Slow, sock=a))
            async def c():
                b.send(b"x")
                await asyncio.sleep(30)
            threading.Timer(0.2, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)).start()
            try:
                await cell(c())
            except KeyboardInterrupt:
                put("cell", "KeyboardInterrupt")
            put("loop_alive", await cell(asyncio.sleep(0, "alive")))
            transport.close()
            b.close()
        """
    )
    assert (r.get("in_callback"), r.get("cell"), r.get("loop_alive")) == (True, "KeyboardInterrupt", "alive"), r


# -------------------------------------------------------------------------- closing


def test_closing_runs_finally_blocks_and_abandons_a_task_that_ignores_its_cancel():
    """A pending task's finally runs (it may await); a stock Task that swallows its
    cancel is abandoned after the grace instead of holding the exit for good."""
    r = run_case(
        """
        GRACE = 0.3
        FINALS = []
        async def body(loop):
            async def polite():
                try:
                    await asyncio.sleep(100)
                finally:
                    await asyncio.sleep(0.01)
                    FINALS.append("polite")
            async def stubborn():
                while True:
                    try:
                        await asyncio.sleep(100)
                    except asyncio.CancelledError:
                        pass
            loop.create_task(polite())
            asyncio.Task(stubborn(), loop=loop)
            await trio.sleep(0.01)
        t0 = time.monotonic()
        try:
            trio.run(_main)
        finally:
            put("finals", FINALS)
            put("closed_in", time.monotonic() - t0)
            print("RESULTS " + json.dumps(RESULTS), flush=True)
        sys.exit(0)
        """,
        timeout=30,
    )
    assert r["finals"] == ["polite"], r
    assert "did not end when cancelled: abandoned" in r["_stderr"], r["_stderr"]


def test_nest_asyncio_gets_a_clear_error_and_the_loop_keeps_working():
    r = run_case(
        """
        import nest_asyncio
        async def body(loop):
            async def f():
                await asyncio.sleep(0.01)
                return 42
            nest_asyncio.apply()
            try:
                asyncio.get_event_loop().run_until_complete(f())
                put("run_until_complete", "ran")
            except RuntimeError as e:
                put("run_until_complete", type(e).__name__)
            put("get_event_loop_is_kernels", asyncio.get_event_loop() is loop)
            put("await", await cell(f()))
            async def pending():
                await asyncio.sleep(100)
            asyncio.ensure_future(pending(), loop=loop)
        """,
        timeout=30,
    )
    assert r["run_until_complete"] == "KernelLoopError", r
    assert (r["get_event_loop_is_kernels"], r["await"]) == (True, 42), r
    assert r["_exit"] == 0, r["_stderr"]


def test_a_mixed_task_shows_its_own_coroutine():
    r = run_case(
        """
        async def body(loop):
            async def ticker():
                await trio.sleep(1)
            t = loop.create_task(ticker())
            put("repr", repr(t))
            put("coro", t.get_coro().__qualname__)
            put("type", type(t).__name__)
            t.cancel()
        """
    )
    assert r["repr"].startswith("<Task pending name='Task-"), r
    assert "coro=<body.<locals>.ticker()" in r["repr"], r
    assert (r["coro"], r["type"]) == ("body.<locals>.ticker", "Task"), r


# -------------------------------------------------------------------------- which cells await


def test_cell_awaits_agrees_with_the_compiler():
    """aioloop.cell_awaits never says no where the compiler makes the cell a coroutine."""
    r = run_case(
        """
        import ast, inspect
        SNIPPETS = [
            "await f()", "x = [await f() for i in y]", "x = [i async for i in y]", "g = (await f() for i in y)",
            "async def f(): await g()", "lambda: 1", "async with a: pass", "async for i in a: pass",
            "{k: await v for k in y}", "f(await g())", "if x:\\n    await f()",
            "match x:\\n    case 1:\\n        await f()",
            "try:\\n    pass\\nexcept* E:\\n    await f()", "def f():\\n    pass", "x = 1\\ny = x + 1", "pass",
            "@d\\nasync def f():\\n    await g()", "class A:\\n    def f(self):\\n        return 1",
            "g = ((await f() for i in y) for j in z)", "print([await f() for i in (j async for j in y)])",
        ]
        async def body(loop):
            out = []
            for s in SNIPPETS:
                code = compile(s, "<cell>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
                out.append([s, bool(code.co_flags & inspect.CO_COROUTINE), aioloop.cell_awaits(ast.parse(s).body)])
            put("out", out)
        """
    )
    wrong = [(s, compiled) for s, compiled, ours in r["out"] if compiled and not ours]
    assert wrong == [], wrong
    sync = [s for s, compiled, ours in r["out"] if ours and not compiled]
    assert sync == ["g = ((await f() for i in y) for j in z)"], sync  # the one over-approximation


def test_starting_the_kernel_imports_neither_ipython_nor_trio_asyncio():
    """The io run answers kernel_info while the user run imports IPython (docs/design.md,
    "Threads and loops"): the kernel's modules, as launch imports them, leave IPython and
    trio-asyncio for the user run (aioloop.py once imported tracebacks at module level,
    and userrun imported aioloop: IPython loaded before the io thread started)."""
    code = "import sys, trikernel.launch.kernel\nprint(sorted({'IPython', 'trio_asyncio'} & set(sys.modules)))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout.strip()) == (0, "[]"), p.stderr
