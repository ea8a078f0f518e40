"""Magics in trikernel (issue 16, sections 2 and 3). Tier 3: real kernels, jupyter_client clients.

Section 2: top-level ``await`` under ``%time``, ``%%time``, ``%timeit``,
``%%timeit`` (and ``%%capture``), measured as IPython measures, awaited in
the user trio run. Section 3: ``%connect_info`` (checked by attaching a
second client and ``jupyter console --existing`` with what it prints), the
other kernel-specific magics of ipykernel, ``%autoawait``.

Durations asserted here are lower bounds the code under test guarantees
(a ``trio.sleep(0.3)`` cannot take less than 0.3 s of wall time, CPU burnt
by ``time.thread_time`` is counted) or sanity checks with wide margins,
never speed targets.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import (
    TIMEOUT,
    collect_outputs,
    env_set,
    execute,
    install_kernelspec,
    start_kernel,
    stdout_of,
    stop_kernel,
    wait_for_marker,
    wait_ready,
    which,
)
from jupyter_client.blocking.client import BlockingKernelClient

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


def test_autoawait_off_and_other_loops(jupyter_path):
    """``%autoawait`` reports asyncio (asyncio and trio alike, issue 24); off disables
    top-level await (under %time too); trio is pure trio; curio is refused."""
    km, kc = start_kernel("trikernel-test-signal")
    try:
        _c, out = ok(kc, "%autoawait")
        assert stdout_of(out) == (
            "IPython autoawait is `on`, and set to use `asyncio`: cells may await asyncio and trio alike\n"
        )
        reply, out = execute(kc, "%autoawait curio", stop_on_error=False)
        assert (reply["content"]["status"], reply["content"]["ename"]) == ("error", "UsageError")
        assert "asyncio and trio" in reply["content"]["evalue"]
        ok(kc, "%autoawait off")
        reply, _ = execute(kc, "import trio\nawait trio.sleep(0)", stop_on_error=False)
        assert reply["content"]["ename"] == "SyntaxError", reply["content"]
        reply, _ = execute(kc, "%time await trio.sleep(0)", stop_on_error=False)
        assert reply["content"]["ename"] == "SyntaxError", reply["content"]
        ok(kc, "%autoawait trio")
        ok(kc, "await trio.sleep(0)")
        ok(kc, "%time await trio.sleep(0)")
        _c, out = ok(kc, "%autoawait")
        assert stdout_of(out).startswith("IPython autoawait is `on`, and set to use `trio`: ")
    finally:
        stop_kernel(km, kc)


# --------------------------------------------------------------------------
# section 3: %connect_info and the other kernel magics


def connect_info(kc: ValidatingClient) -> tuple[dict[str, Any], str]:
    """(the printed JSON, the text after it)."""
    _c, out = ok(kc, "%connect_info")
    text = stdout_of(out)
    head, _, rest = text.partition("\n}\n")
    return json.loads(head + "\n}"), rest


def test_connect_info_attaches_a_second_client(tk, tmp_path):
    """issue 16 §3: the printed JSON is a working connection file for a second client."""
    info, _rest = connect_info(tk)
    path = tmp_path / "attach.json"
    path.write_text(json.dumps(info))
    other = BlockingKernelClient()
    other.load_connection_file(str(path))
    other.start_channels()
    try:
        wait_ready(None, other)
        reply, out = execute(other, "print(6 * 7)")
        assert reply["content"]["status"] == "ok"
        assert stdout_of(out) == "42\n"
    finally:
        other.stop_channels()


@pytest.fixture
def runtime_kernel(jupyter_path: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    """A kernel whose connection file lives in Jupyter's runtime directory (a
    private one: JUPYTER_RUNTIME_DIR, inherited by the kernel and by clients)."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    km, kc = start_kernel("trikernel-test-signal", connection_file=str(runtime / "kernel-connect-info.json"))
    yield km, kc
    stop_kernel(km, kc)


def test_connect_info_matches_the_kernel_and_names_its_file(runtime_kernel):
    km, kc = runtime_kernel
    info, rest = connect_info(kc)
    expected = km.get_connection_info(session=False)
    for field in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port", "ip", "transport"):
        assert info[field] == expected[field], field
    assert info["key"] == expected["key"].decode()
    assert info["signature_scheme"] == expected["signature_scheme"]
    assert "Paste the above JSON into a file" in rest
    # in Jupyter's runtime directory the file's name alone is enough, as ipykernel prints it
    assert "$> jupyter <app> --existing kernel-connect-info.json\n" in rest, rest


def test_connect_info_names_a_file_elsewhere_by_its_path(tk):
    _info, rest = connect_info(tk)
    m = re.search(r"--existing (\S+)\nor even just", rest)
    assert m is not None, rest
    assert os.path.isabs(m.group(1)), rest
    assert json.loads(Path(m.group(1)).read_text())["shell_port"] == _info["shell_port"]


def test_jupyter_console_existing_as_printed(runtime_kernel):
    """Attach ``jupyter console --existing <name>`` exactly as %connect_info says; the kernel keeps running."""
    pytest.importorskip("jupyter_console")
    _km, kc = runtime_kernel
    _info, rest = connect_info(kc)
    m = re.search(r"--existing (\S+)\nor even just", rest)
    assert m is not None, rest
    r = subprocess.run(
        [which("jupyter"), "console", "--existing", m.group(1), "--simple-prompt"],
        input="print(6 * 7)\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "42" in re.sub(r"\x1b\[[0-9;]*m", "", r.stdout), (r.stdout[-2000:], r.stderr[-2000:])
    ok(kc, "print('still here')")


def test_connect_info_of_a_handshake_kernel(tmp_path):
    """Started from a JEP 66 registration file: the bound ports, and no file of its own to name."""
    root = install_kernelspec(tmp_path, "trikernel-test-hs", "--handshake")
    with env_set("JUPYTER_PATH", root, prepend_path=True):
        km, kc = start_kernel("trikernel-test-hs")
    try:
        info, rest = connect_info(kc)
        expected = km.get_connection_info(session=False)
        assert {p: info[p] for p in ("shell_port", "iopub_port", "hb_port")} == {
            p: expected[p] for p in ("shell_port", "iopub_port", "hb_port")
        }
        assert "registration file" in rest
        assert "--existing <file>" in rest
    finally:
        stop_kernel(km, kc)


def test_edit_less_more_autosave_subshell_qtconsole(tk, tmp_path):
    """ipykernel's other kernel magics: payloads, the pager, a display, clear messages."""
    f = tmp_path / "notes.txt"
    f.write_text("some notes\n")
    c, _ = ok(tk, f"%edit {f}")
    assert c["payload"] == [{"source": "edit_magic", "filename": str(f.resolve()), "line_number": None}]
    for magic in ("less", "more"):
        c, _ = ok(tk, f"%{magic} {f}")
        assert [(p["source"], p["data"]["text/plain"]) for p in c["payload"]] == [("page", "some notes\n")]
    reply, _ = execute(tk, "%less", stop_on_error=False)
    assert (reply["content"]["ename"], reply["content"]["evalue"]) == ("UsageError", "Missing filename.")
    _c, out = ok(tk, "%autosave 30")
    js = [m["content"]["data"] for m in out if m["msg_type"] == "display_data"]
    assert js == [{"application/javascript": "IPython.notebook.set_autosave_interval(30000)"}]
    assert stdout_of(out) == "Autosaving every 30 seconds\n"
    _c, out = ok(tk, "%subshell")
    assert stdout_of(out).splitlines()[0] == "subshell id: None"  # the rest: tests/test_subshells.py
    reply, _ = execute(tk, "%qtconsole", stop_on_error=False)
    c = reply["content"]
    assert (c["status"], c["ename"]) == ("error", "UsageError")
    assert "jupyter qtconsole --existing" in c["evalue"]
    c, _ = ok(tk, f"%ed {f}")
    assert c["payload"][0]["source"] == "edit_magic"


def test_debug_post_mortem_over_stdin(tk):
    """``%debug`` after an error: the debugger prompts through input_request and inspects the frame."""
    execute(tk, "def f(x):\n    y = x * 2\n    return 1 / 0\nf(21)", stop_on_error=False)
    msg_id = tk.execute("%debug", allow_stdin=True)
    answers = ["p y", "q"]
    while answers:
        req = tk.get_stdin_msg(timeout=TIMEOUT)
        assert req["content"]["prompt"].strip() == "ipdb>"
        tk.input(answers.pop(0))
    out = collect_outputs(tk, msg_id)
    assert "42" in stdout_of(out)


def test_nested_run_cell_that_awaits_says_why_it_cannot(tk):
    """``get_ipython().run_cell("await ...")`` from a cell: a clear error, not trio's "run() inside a run()"."""
    reply, out = execute(tk, "r = get_ipython().run_cell('await trio.sleep(0)')")
    assert reply["content"]["status"] == "ok", "the outer cell itself did not fail"
    errors = [m["content"] for m in out if m["msg_type"] == "error"]
    assert [e["ename"] for e in errors] == ["RuntimeError"], errors
    assert "cannot run code that awaits" in errors[0]["evalue"]
    _c, out = ok(tk, "get_ipython().run_cell('nested = 6 * 7');\nnested")
    assert result_of(out) == "42", "a nested run_cell without await still runs"
