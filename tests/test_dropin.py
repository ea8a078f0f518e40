"""Tier 3: the conventions frontends and tools rely on under ipykernel (issue 25).

Each test drives a real kernel through jupyter_client: an interrupt at a
``pdb.set_trace()`` prompt ends the debugger; cells are named as ipykernel
names them.
"""

from __future__ import annotations

import contextlib
import os
import queue
import time
from typing import TYPE_CHECKING, Any

from conftest import TIMEOUT, collect_outputs, execute, start_kernel, stdout_of, stop_kernel

from trikernel.user.cellnames import HASH_SEED, murmur2

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


def test_an_interrupt_at_a_pdb_prompt_ends_the_cell(own_kernel: tuple[Any, Any]) -> None:
    """ipykernel's ``init_pdb``: IPython's InterruptiblePdb quits the debugger
    on an interrupt and the cell runs on to its end, as under ipykernel (its
    reply is ``ok`` there too). Before, stdlib pdb caught the
    KeyboardInterrupt, printed ``--KeyboardInterrupt--`` and prompted again:
    the cell never ended, nor did the one queued behind it. (``breakpoint()``
    does not prompt: test_breakpoint_without_the_debugger_does_nothing.)"""
    km, kc = own_kernel
    msg_id = kc.execute("import pdb\npdb.set_trace()\nprint('after')", allow_stdin=True)
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


CELL = "import os, sys\nprint(os.getpid(), sys._getframe().f_code.co_filename)"


def test_cells_are_named_as_ipykernel_names_them(own_kernel: tuple[Any, Any]) -> None:
    """``<tmp>/ipykernel_<pid>/<murmur2>.py`` from the first cell on: JupyterLab
    (4.5+) shows a breakpoint or frame in such a file as ``Cell [n]``, only
    for paths containing ``ipykernel_``; debugInfo announces the same
    prefix. Before: ``<ipython-input-1-…>`` until the debugger started, then
    ``trikernel_<pid>``."""
    _km, kc = own_kernel
    r, out = execute(kc, CELL)
    assert r["content"]["status"] == "ok"
    pid, name = stdout_of(out).split()
    import tempfile

    assert name == os.path.join(tempfile.gettempdir(), f"ipykernel_{pid}", f"{murmur2(CELL, HASH_SEED)}.py")
    msg = kc.session.msg("debug_request", {"type": "request", "seq": 1, "command": "debugInfo", "arguments": {}})
    kc.control_channel.send(msg)
    reply = kc.get_control_msg(timeout=TIMEOUT)
    assert reply["content"]["body"]["tmpFilePrefix"] == os.path.dirname(name) + os.sep


def test_ipykernel_cell_name_wins(jupyter_path: str) -> None:
    """``$IPYKERNEL_CELL_NAME``, read at every compile, is the cell's file
    name (nbclient's tests set ``<IPY-INPUT>``; their expected tracebacks
    have the three context lines IPython gives such names)."""
    km, kc = start_kernel("trikernel-test-signal", env={**os.environ, "IPYKERNEL_CELL_NAME": "<IPY-INPUT>"})
    try:
        r, out = execute(kc, CELL)
        assert r["content"]["status"] == "ok"
        assert stdout_of(out).split()[1] == "<IPY-INPUT>"
    finally:
        stop_kernel(km, kc)


def _process(km: Any) -> Any:
    return km.provisioner.process


@pytest.mark.parametrize("call", ["exit()", "quit()"])
def test_exit_stops_the_kernel_after_its_reply(own_kernel: tuple[Any, Any], call: str) -> None:
    """As ipykernel: the reply (with its ``ask_exit`` payload) and idle, then
    the normal shutdown; the process ends, exit code 0. Before: the payload
    only, the process still alive 10 s later."""
    km, kc = own_kernel
    r, out = execute(kc, call)
    assert r["content"]["status"] == "ok"
    assert r["content"]["payload"] == [{"source": "ask_exit", "keepkernel": False}]
    assert out[-1]["content"]["execution_state"] == "idle"
    assert _process(km).wait(timeout=2) == 0  # the deadline the issue asks for


def test_exit_keep_kernel_keeps_it(own_kernel: tuple[Any, Any]) -> None:
    km, kc = own_kernel
    r, _ = execute(kc, "exit(keep_kernel=True)")
    assert r["content"]["payload"] == [{"source": "ask_exit", "keepkernel": True}]
    r, _out = execute(kc, "1 + 1")
    assert r["content"]["status"] == "ok"
    assert km.is_alive()


@pytest.mark.parametrize("channel", ["shell", "control"])
def test_connect_request_is_answered_with_the_ports(own_kernel: tuple[Any, Any], channel: str) -> None:
    """Deprecated since protocol 5.1, still sent by old clients; ipykernel
    answers it. Before: ``UnknownMessageType``."""
    km, kc = own_kernel
    msg = kc.session.msg("connect_request", {})
    getattr(kc, f"{channel}_channel").send(msg)
    get = kc.get_shell_msg if channel == "shell" else kc.get_control_msg
    reply = get(timeout=TIMEOUT)
    assert reply["parent_header"]["msg_id"] == msg["header"]["msg_id"]
    ports = {f"{c}_port": km.get_connection_info()[f"{c}_port"] for c in ("shell", "iopub", "stdin", "hb", "control")}
    assert reply["content"] == {"status": "ok", **ports}


def test_input_without_stdin_says_what_ipykernel_says(jupyter_path: str, tmp_path: Any) -> None:
    """nbclient's test_disable_stdin compares the evalue word for word;
    ``__session__`` is ``$JPY_SESSION_NAME`` (the notebook's path, set by
    jupyter_server), and ``sys.stdout._is_master_process()`` exists, as in
    ipykernel."""
    notebook = str(tmp_path / "my.ipynb")
    km, kc = start_kernel("trikernel-test-signal", env={**os.environ, "JPY_SESSION_NAME": notebook})
    try:
        r, _ = execute(kc, "input('?')", allow_stdin=False)
        assert (r["content"]["ename"], r["content"]["evalue"]) == (
            "StdinNotImplementedError",
            "raw_input was called, but this frontend does not support input requests.",
        )
        r, _ = execute(kc, "import getpass\ngetpass.getpass()", allow_stdin=False)
        assert r["content"]["evalue"] == "getpass was called, but this frontend does not support input requests."
        r, out = execute(kc, "import sys\nprint(__session__, sys.stdout._is_master_process())")
        assert stdout_of(out) == f"{notebook} True\n"
    finally:
        stop_kernel(km, kc)


def test_cells_skipped_by_run_all_get_no_prompt_number(own_kernel: tuple[Any, Any]) -> None:
    """JupyterLab's "Run All" with an error in the first cell: it shows the
    ``execution_count`` of each ``execute_reply`` as the cell's prompt
    (``model.executionCount = msg.content.execution_count``), so the
    skipped cells showed ``[2]:`` as if they had run. Their replies now
    carry no count (as ipykernel's ``aborted`` reply; its prompt stays
    empty), while staying the spec's error reply (5.1) that trikernel's own
    schema and jupyter_kernel_test's accept."""
    from trikernel.protocol import msgspec

    _km, kc = own_kernel
    first = kc.execute("import time; time.sleep(0.3); 1/0")
    skipped = [kc.execute("print('should not run')"), kc.execute("x = 5\nx")]
    failed = reply_to(kc, first)
    assert (failed["content"]["status"], failed["content"]["execution_count"]) == ("error", 1)
    for msg_id in skipped:
        reply = reply_to(kc, msg_id)  # checked against msgspec_v5 by the ValidatingClient
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "ExecutionAborted"
        assert "execution_count" not in reply["content"], reply["content"]
        assert reply["metadata"]["status"] == "aborted"
        assert msgspec.validate_message(reply, channel="shell", sender="kernel") == []
    r, _ = execute(kc, "'x' in globals()")
    assert r["content"]["execution_count"] == 2  # the skipped cells took no count


@pytest.mark.parametrize("allow_stdin", [False, True])
def test_breakpoint_without_the_debugger_does_nothing(own_kernel: tuple[Any, Any], allow_stdin: bool) -> None:
    """ipykernel's ``sys.breakpointhook`` is debugpy's (its kernel imports
    ``debugpy.server`` at start-up), a no-op while no debugger client is
    attached: a cell with ``breakpoint()`` runs on, under nbclient and
    papermill (no stdin) and in JupyterLab with the debugger off alike.
    Before, without stdin it failed with StdinNotImplementedError; with it,
    it stopped at a pdb prompt. PYTHONBREAKPOINT is not read, as there."""
    _km, kc = own_kernel
    msg_id = kc.execute("breakpoint()\nprint('after')", allow_stdin=allow_stdin)
    prompts = []
    deadline = time.monotonic() + TIMEOUT
    while True:  # the reply, answering a pdb prompt (main before the fix) so the cell ends
        try:
            reply = kc.get_shell_msg(timeout=0.05)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        except queue.Empty:
            pass
        with contextlib.suppress(queue.Empty):
            prompts.append(kc.get_stdin_msg(timeout=0.05)["content"]["prompt"])
            kc.input("c")
        assert time.monotonic() < deadline, "no reply"
    assert prompts == []
    assert reply["content"]["status"] == "ok", reply["content"]
    assert stdout_of(collect_outputs(kc, msg_id)) == "after\n"
    _r, out = execute(kc, "import sys\nprint(sys.breakpointhook.__name__)")
    assert stdout_of(out) == "breakpoint_without_debugger\n"


def test_banner_engine_info_and_stream_encoding_as_ipykernel(own_kernel: tuple[Any, Any]) -> None:
    """kernel_info's ``banner`` is IPython's (jupyter console prints it; before,
    one line of trikernel's), a failed cell's reply carries ipykernel's
    ``engine_info`` (its ``engine_uuid`` is the metadata's ``engine``), and
    ``sys.stdout.encoding`` is spelled ``UTF-8`` as ipykernel's OutStream has it."""
    from IPython.core.usage import default_banner

    _km, kc = own_kernel
    kc.kernel_info()
    info = kc.get_shell_msg(timeout=TIMEOUT)
    assert info["content"]["banner"] == default_banner
    r, _ = execute(kc, "1/0")
    assert r["content"]["engine_info"] == {
        "engine_uuid": r["metadata"]["engine"],
        "engine_id": -1,
        "method": "execute",
    }
    ok, _ = execute(kc, "1")
    assert "engine_info" not in ok["content"]
    r, out = execute(
        kc,
        "import sys\nfrom IPython.core.usage import default_banner\n"  # shell.banner adds a random tip
        "print(sys.stdout.encoding, sys.stderr.encoding, get_ipython().kernel.banner.startswith(default_banner))",
    )
    assert stdout_of(out) == "UTF-8 UTF-8 True\n"
