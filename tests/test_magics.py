"""Magics in trikernel (issue 16, sections 2 and 3). Tier 3: real kernels, jupyter_client clients.

Section 2: top-level ``await`` under ``%time``, ``%%time``, ``%timeit``,
``%%timeit`` (and ``%%capture``), measured as IPython measures, awaited in
the user trio run.

Durations asserted here are lower bounds the code under test guarantees
(a ``trio.sleep(0.3)`` cannot take less than 0.3 s of wall time, CPU burnt
by ``time.thread_time`` is counted) or sanity checks with wide margins,
never speed targets.
"""

from __future__ import annotations

import json
import re
import textwrap
from typing import TYPE_CHECKING, Any

import pytest
from conftest import (
    collect_outputs,
    execute,
    start_kernel,
    stdout_of,
    stop_kernel,
    wait_for_marker,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from conftest import ValidatingClient

pytestmark = pytest.mark.timeout(180)

UNITS = {"s": 1.0, "ms": 1e-3, "μs": 1e-6, "us": 1e-6, "ns": 1e-9}
WALL_RE = re.compile(r"^Wall time: ([\d.]+) (s|ms|μs|us|ns)$", re.M)
CPU_RE = re.compile(
    r"^CPU times: user ([\d.]+) (s|ms|μs|us|ns), sys: ([\d.]+) (s|ms|μs|us|ns), total: ([\d.]+) (s|ms|μs|us|ns)$", re.M
)
TIMEIT_RE = re.compile(r"per loop \(mean ± std\. dev\. of (\d+) runs?, (\d+) loops? each\)")

SETUP = textwrap.dedent(
    """\
    import gc, time, trio
    cell_task = trio.lowlevel.current_task()
    cell_token = trio.lowlevel.current_trio_token()
    calls = []

    async def probe(value=42):
        # where each awaited call ran: the cell's own task in the user trio run
        calls.append((trio.lowlevel.current_task() is cell_task, trio.lowlevel.current_trio_token() is cell_token))
        await trio.sleep(0)
        return value

    async def burn(seconds):
        await trio.sleep(0)
        t0 = time.thread_time()
        while time.thread_time() - t0 < seconds:
            pass
        await trio.sleep(0)

    async def boom():
        await trio.sleep(0)
        raise ValueError("boom in timed code")
    """
)


def seconds(value: str, unit: str) -> float:
    return float(value) * UNITS[unit]


def times(text: str) -> tuple[float, float]:
    """(CPU total, wall) in seconds from IPython's ``%time`` output."""
    cpu = CPU_RE.search(text)
    wall = WALL_RE.search(text)
    assert cpu is not None, text
    assert wall is not None, text
    return seconds(cpu.group(5), cpu.group(6)), seconds(wall.group(1), wall.group(2))


def ok(kc: ValidatingClient, src: str, **kw: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    reply, out = execute(kc, src, **kw)
    c = reply["content"]
    errors = [m["content"] for m in out if m["msg_type"] == "error"]
    assert c["status"] == "ok", (c, errors)
    assert not errors, errors
    return c, out


def result_of(out: list[dict[str, Any]]) -> str | None:
    res = [m["content"]["data"]["text/plain"] for m in out if m["msg_type"] == "execute_result"]
    assert len(res) <= 1, res
    return res[0] if res else None


@pytest.fixture(scope="module")
def tk(jupyter_path: str) -> Iterator[ValidatingClient]:
    km, kc = start_kernel("trikernel-test-signal")
    ok(kc, SETUP)
    yield kc
    stop_kernel(km, kc)


def reset_calls(kc: ValidatingClient) -> None:
    ok(kc, "calls.clear()")


def calls_of(kc: ValidatingClient) -> list[list[bool]]:
    _c, out = ok(kc, "import json; print(json.dumps(calls))")
    return json.loads(stdout_of(out))  # type: ignore[no-any-return]


# --------------------------------------------------------------------------
# section 2: %time / %%time


def test_time_awaits_and_measures_wall_time(tk):
    """issue 16 §2: ``%time await trio.sleep(...)`` runs, and its wall time covers the sleep."""
    _c, out = ok(tk, "%time await trio.sleep(0.3)")
    cpu, wall = times(stdout_of(out))
    assert wall >= 0.3, stdout_of(out)
    assert cpu < wall, "sleeping is not CPU time: " + stdout_of(out)
    assert result_of(out) is None


def test_time_await_counts_cpu_time(tk):
    """CPU time is measured as IPython measures it (the process's user+sys time)."""
    _c, out = ok(tk, "%time await burn(0.2)")
    cpu, wall = times(stdout_of(out))
    assert cpu >= 0.2, stdout_of(out)
    assert wall >= 0.2, stdout_of(out)


def test_time_await_value_assignment_and_semicolon(tk):
    reset_calls(tk)
    _c, out = ok(tk, "%time await probe(41)")
    assert result_of(out) == "41"
    _c, out = ok(tk, "x = %time await probe(42)\nx")
    assert result_of(out) == "42"
    assert "Wall time" in stdout_of(out)
    _c, out = ok(tk, "%time await probe(43);")
    assert result_of(out) is None, "a trailing ; silences the value, as in IPython"
    assert "Wall time" in stdout_of(out)
    assert calls_of(tk) == [[True, True]] * 3, "awaited in the cell's task of the user trio run"


def test_cell_time_with_await(tk):
    """``%%time`` over a cell that awaits, prints, uses a nursery and ends with an expression."""
    src = textwrap.dedent(
        """\
        %%time
        await trio.sleep(0.1)
        print("inside")
        async with trio.open_nursery() as n:
            n.start_soon(trio.sleep, 0.1)
        await probe(7)
        """
    )
    _c, out = ok(tk, src)
    text = stdout_of(out)
    assert text.startswith("inside\n"), text
    _cpu, wall = times(text)
    assert wall >= 0.2, text
    assert result_of(out) == "7"


def test_time_await_inside_a_block_and_in_a_nested_magic(tk):
    _c, out = ok(tk, "if True:\n    %time await trio.sleep(0.05)")
    assert times(stdout_of(out))[1] >= 0.05
    _c, out = ok(tk, "%%time\n%time await trio.sleep(0.05)\n")
    assert len(WALL_RE.findall(stdout_of(out))) == 2, stdout_of(out)


def test_time_await_error_is_raised_after_the_times(tk):
    reply, out = execute(tk, "%time await boom()", stop_on_error=False)
    c = reply["content"]
    assert c["status"] == "error", c
    assert (c["ename"], c["evalue"]) == ("ValueError", "boom in timed code")
    assert "Wall time" in stdout_of(out)
    _c, out = ok(tk, "%time --no-raise-error await boom()")
    assert "Wall time" in stdout_of(out)


def test_time_statement_after_cell_magic_is_a_usage_error(tk):
    reply, _out = execute(tk, "%%time await trio.sleep(0)\nawait trio.sleep(0)\n", stop_on_error=False)
    c = reply["content"]
    assert (c["status"], c["ename"]) == ("error", "UsageError")


def test_sync_time_and_timeit_are_ipythons(tk):
    """Code without await goes through IPython's own magics, unchanged."""
    _c, out = ok(tk, "%time 2**10")
    assert result_of(out) == "1024"
    assert "Wall time" in stdout_of(out)
    _c, out = ok(tk, "%timeit -n 3 -r 2 sum(range(10))")
    m = TIMEIT_RE.search(stdout_of(out))
    assert m is not None, stdout_of(out)
    assert m.groups() == ("2", "3")


# --------------------------------------------------------------------------
# section 2: %timeit / %%timeit


def test_timeit_awaits_the_requested_number_of_times_in_the_user_run(tk):
    """issue 16 §2: ``%timeit -n 5 -r 3 await f()`` awaits f exactly 15 times, in the user trio run."""
    reset_calls(tk)
    _c, out = ok(tk, "%timeit -n 5 -r 3 await probe()")
    m = TIMEIT_RE.search(stdout_of(out))
    assert m is not None, stdout_of(out)
    assert m.groups() == ("3", "5")
    assert calls_of(tk) == [[True, True]] * 15


def test_timeit_await_result_object_and_quiet(tk):
    reset_calls(tk)
    _c, out = ok(tk, "r = %timeit -o -q -n 2 -r 4 await probe()\n(r.loops, r.repeat, len(r.all_runs))")
    assert stdout_of(out) == "", "-q prints nothing"
    assert result_of(out) == "(2, 4, 4)"
    _c, out = ok(tk, "%timeit -v saved -q -n 1 -r 2 await probe()\nsaved.loops, saved.repeat")
    assert result_of(out) == "(1, 2)"
    assert len(calls_of(tk)) == 8 + 2


def test_timeit_await_measures_the_awaited_time(tk):
    _c, out = ok(tk, "r = %timeit -o -q -n 2 -r 2 await trio.sleep(0.05)\nmin(r.all_runs) >= 2 * 0.05")
    assert result_of(out) == "True"


def test_cell_timeit_with_awaiting_setup_and_body(tk):
    """``%%timeit`` setup line and body both await; setup runs once per run, as in IPython."""
    ok(tk, "setups = 0\nasync def setup():\n    global setups\n    setups += 1\n    await trio.sleep(0)")
    reset_calls(tk)
    _c, out = ok(tk, "%%timeit -n 2 -r 3 await setup()\nawait probe()\n")
    m = TIMEIT_RE.search(stdout_of(out))
    assert m is not None, stdout_of(out)
    assert m.groups() == ("3", "2")
    _c, out = ok(tk, "setups")
    assert result_of(out) == "3"
    assert len(calls_of(tk)) == 6


def test_timeit_await_chooses_the_loop_count_as_ipython(tk):
    """Without -n: the first power of ten whose run takes >= 0.2 s (0.05 s sleeps: 10 loops)."""
    _c, out = ok(tk, "%timeit -r 1 await trio.sleep(0.05)")
    m = TIMEIT_RE.search(stdout_of(out))
    assert m is not None, stdout_of(out)
    assert m.groups() == ("1", "10")


def test_timeit_interrupted_reenables_gc(jupyter_path):
    """An interrupt during an awaiting %timeit run: KeyboardInterrupt, and the collector is on again."""
    km, kc = start_kernel("trikernel-test-signal")
    try:
        ok(kc, "import gc, trio\nasync def slow():\n    print('STARTED')\n    await trio.sleep(1)")
        # the marker comes from inside the awaited statement: the run (gc off) is under way
        msg_id = kc.execute("%timeit -n 1 -r 50 await slow()\n")
        wait_for_marker(kc, msg_id)
        km.interrupt_kernel()
        out = collect_outputs(kc, msg_id)
        errors = [m["content"] for m in out if m["msg_type"] == "error"]
        assert [e["ename"] for e in errors] == ["KeyboardInterrupt"], errors
        _c, out = ok(kc, "gc.isenabled()")
        assert result_of(out) == "True"
    finally:
        stop_kernel(km, kc)


def test_time_interrupted_prints_times_then_raises(jupyter_path):
    km, kc = start_kernel("trikernel-test-signal")
    try:
        ok(kc, "import trio\nasync def slow():\n    print('STARTED')\n    await trio.sleep(30)")
        msg_id = kc.execute("%time await slow()\n")
        wait_for_marker(kc, msg_id)
        km.interrupt_kernel()
        out = collect_outputs(kc, msg_id)
        errors = [m["content"] for m in out if m["msg_type"] == "error"]
        assert [e["ename"] for e in errors] == ["KeyboardInterrupt"], errors
        assert "Wall time" in stdout_of(out)
        ok(kc, "print('serving')")
    finally:
        stop_kernel(km, kc)


def test_a_users_own_time_magic_is_left_alone(jupyter_path):
    """Only IPython's %time is rewritten: a user's magic named ``time`` gets its line as written."""
    user_magic = (
        "from IPython.core.magic import register_line_magic\n@register_line_magic\ndef time(line):\n    return line"
    )
    km, kc = start_kernel("trikernel-test-signal")
    try:
        ok(kc, user_magic)
        _c, out = ok(kc, "%time await anything()")
        assert result_of(out) == "'await anything()'"
    finally:
        stop_kernel(km, kc)


def test_capture_cell_with_await(tk):
    """``%%capture`` over a cell that awaits: captured, in the user trio run."""
    reset_calls(tk)
    _c, out = ok(tk, "%%capture captured\nprint('hidden')\nawait probe()\ndisplay('shown later')\n")
    assert stdout_of(out) == ""
    assert not [m for m in out if m["msg_type"] == "display_data"]
    _c, out = ok(tk, "captured.stdout, len(captured.outputs)")
    assert result_of(out) == "('hidden\\n', 1)"
    assert calls_of(tk) == [[True, True]]


def test_nested_run_cell_that_awaits_says_why_it_cannot(tk):
    """``get_ipython().run_cell("await ...")`` from a cell: a clear error, not trio's "run() inside a run()"."""
    reply, out = execute(tk, "r = get_ipython().run_cell('await trio.sleep(0)')")
    assert reply["content"]["status"] == "ok", "the outer cell itself did not fail"
    errors = [m["content"] for m in out if m["msg_type"] == "error"]
    assert [e["ename"] for e in errors] == ["RuntimeError"], errors
    assert "cannot run code that awaits" in errors[0]["evalue"]
    _c, out = ok(tk, "get_ipython().run_cell('nested = 6 * 7');\nnested")
    assert result_of(out) == "42", "a nested run_cell without await still runs"
