"""The JupyterLab debugger (debugger.py, dap.py) against a real kernel subprocess.

Driven by jupyter_client as JupyterLab drives it (messaging spec "Debug
request", "Debug event", "Additions to the DAP"): debug_request on control,
debug_event on IOPub. Every debug message read is checked against the DAP
shapes of trikernel/protocol/msgspec.py (conftest.ValidatingClient). The kernels run
from the real kernelspec (``kernelspec.kernel_json``: ``-Xfrozen_modules=off``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest
import zmq
from conftest import TIMEOUT, env_set, start_kernel, stop_kernel

from trikernel.debug import debugger as dbgmod
from trikernel.launch.kernelspec import kernel_json
from trikernel.user import cellnames

if TYPE_CHECKING:
    from collections.abc import Iterator

    from jupyter_client.manager import KernelManager

pytest.importorskip("debugpy")

pytestmark = pytest.mark.timeout(180)

SEED = 3339675911
VECTORS = [
    ("a = 1", 3780943274),
    ("def f(a, b):\n    c = a + b\n    return c\n\nf(2, 3)", 1440027060),
    ("", 3990065800),
]
INIT_ARGS = {
    "clientID": "test-client",
    "clientName": "testClient",
    "adapterID": "",
    "pathFormat": "path",
    "linesStartAt1": True,
    "columnsStartAt1": True,
    "supportsVariableType": True,
    "supportsVariablePaging": True,
    "supportsRunInTerminalRequest": True,
    "locale": "en",
}
TRIKERNEL_DIR = os.path.dirname(os.path.dirname(dbgmod.__file__))


def _machinery_dirs() -> tuple[str, ...]:
    import outcome
    import trio

    return (*tuple(os.path.dirname(m.__file__) + os.sep for m in (trio, outcome)), TRIKERNEL_DIR + os.sep)


class Debug:
    """One client's debug session: requests on control, every IOPub message kept."""

    def __init__(self, km: KernelManager, kc: Any):
        self.km = km
        self.kc = kc
        self.seq = 0
        self.iopub: list[dict[str, Any]] = []
        self.read = 0  # index of the first IOPub message not yet looked at by wait_event
        # control replies read while waiting for another one: a kernel_info sent
        # while a debug request waits on debugpy is answered first
        self.early: dict[str, dict[str, Any]] = {}

    # -- requests ------------------------------------------------------------------
    def send(self, command: str, arguments: dict[str, Any] | None = None) -> tuple[str, int]:
        self.seq += 1
        content = {"type": "request", "seq": self.seq, "command": command, "arguments": arguments or {}}
        msg = self.kc.session.msg("debug_request", content)
        self.kc.control_channel.send(msg)
        return msg["header"]["msg_id"], self.seq

    def reply(self, msg_id: str, timeout: float = TIMEOUT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while msg_id not in self.early:
            r = self.kc.get_control_msg(timeout=max(0.1, deadline - time.monotonic()))
            self.early[r["parent_header"].get("msg_id")] = r
        r = self.early.pop(msg_id)
        assert r["msg_type"] == "debug_reply"
        return r["content"]  # type: ignore[no-any-return]

    def __call__(
        self, command: str, arguments: dict[str, Any] | None = None, timeout: float = TIMEOUT
    ) -> dict[str, Any]:
        msg_id, seq = self.send(command, arguments)
        r = self.reply(msg_id, timeout)
        assert r["command"] == command, r
        assert r["request_seq"] == seq, r
        return r

    def ok(self, command: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        r = self(command, arguments)
        assert r["success"], r
        return r

    # -- IOPub ---------------------------------------------------------------------
    def _pull(self, deadline: float) -> None:
        self.iopub.append(self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic())))

    def wait_event(self, name: str, timeout: float = TIMEOUT) -> dict[str, Any]:
        """The next debug_event ``name`` (DAP event content) after the last one waited for."""
        deadline = time.monotonic() + timeout
        while True:
            while self.read < len(self.iopub):
                m = self.iopub[self.read]
                self.read += 1
                if m["msg_type"] == "debug_event" and m["content"]["event"] == name:
                    return m["content"]  # type: ignore[no-any-return]
            self._pull(deadline)

    def wait_idle(self, msg_id: str, timeout: float = TIMEOUT) -> list[dict[str, Any]]:
        """The IOPub messages of request ``msg_id`` up to its idle."""
        deadline = time.monotonic() + timeout
        i = 0
        while True:
            while i < len(self.iopub):
                m = self.iopub[i]
                i += 1
                mine = m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status"
                if mine and m["content"]["execution_state"] == "idle":
                    return [x for x in self.iopub[:i] if x["parent_header"].get("msg_id") == msg_id]
            self._pull(deadline)

    def execute_reply(self, msg_id: str, timeout: float = TIMEOUT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            r = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if r["parent_header"].get("msg_id") == msg_id:
                return r["content"]  # type: ignore[no-any-return]

    def run(self, code: str) -> dict[str, Any]:
        """Execute ``code`` to the end; returns the execute_reply content."""
        msg_id = self.kc.execute(code)
        reply = self.execute_reply(msg_id)
        self.wait_idle(msg_id)
        return reply

    # -- a debug session -------------------------------------------------------------
    def start(self) -> None:
        r = self.ok("initialize", INIT_ARGS)
        assert r["body"]["supportsConfigurationDoneRequest"]
        self.ok("attach")
        self.ok("configurationDone")

    def breakpoint(self, code: str, *lines: int) -> str:
        """dumpCell ``code`` and set breakpoints on ``lines``; returns the cell's path."""
        path: str = self.ok("dumpCell", {"code": code})["body"]["sourcePath"]
        r = self.ok(
            "setBreakpoints",
            {"breakpoints": [{"line": n} for n in lines], "source": {"path": path}, "sourceModified": False},
        )
        assert [b["verified"] for b in r["body"]["breakpoints"]] == [True] * len(lines), r
        return path

    def stop_at(self, code: str, line: int) -> tuple[str, str, int]:
        """Run ``code`` with a breakpoint on ``line`` until it stops there;
        returns (execute msg_id, cell path, threadId)."""
        path = self.breakpoint(code, line)
        msg_id = self.kc.execute(code)
        stopped = self.wait_event("stopped")
        assert stopped["body"]["reason"] == "breakpoint", stopped
        return msg_id, path, stopped["body"]["threadId"]

    def frames(self, thread_id: int) -> list[dict[str, Any]]:
        return self.ok("stackTrace", {"threadId": thread_id})["body"]["stackFrames"]  # type: ignore[no-any-return]

    def locals_of(self, frame_id: int) -> dict[str, dict[str, Any]]:
        scopes = self.ok("scopes", {"frameId": frame_id})["body"]["scopes"]
        ref = scopes[0]["variablesReference"]
        variables = self.ok("variables", {"variablesReference": ref})["body"]["variables"]
        return {v["name"]: v for v in variables}

    def resume(self, thread_id: int, msg_id: str) -> dict[str, Any]:
        """continue, then the cell's execute_reply (after its idle)."""
        self.ok("continue", {"threadId": thread_id})
        reply = self.execute_reply(msg_id)
        self.wait_idle(msg_id)
        return reply


def _spec_dir(root: str, name: str, argv: list[str] | None = None) -> None:
    spec = kernel_json(python=sys.executable, display_name=name)
    if argv is not None:
        spec["argv"] = argv
    d = os.path.join(root, "kernels", name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "kernel.json"), "w") as f:
        json.dump(spec, f)


NO_DEBUGPY = (
    "import sys; sys.modules['debugpy'] = None; import runpy; runpy.run_module('trikernel', run_name='__main__')"
)


@pytest.fixture(scope="module")
def debug_specs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = str(tmp_path_factory.mktemp("jupyter-debug"))
    _spec_dir(root, "trikernel-debug")
    _spec_dir(root, "trikernel-nodebugpy", [sys.executable, "-c", NO_DEBUGPY, "-f", "{connection_file}"])
    with env_set("JUPYTER_PATH", root, prepend_path=True):
        yield root


def _new_debug(name: str = "trikernel-debug") -> Debug:
    km, kc = start_kernel(name)
    return Debug(km, kc)


@pytest.fixture
def fresh(debug_specs: str) -> Iterator[Debug]:
    """A new kernel, debugger not started."""
    d = _new_debug()
    yield d
    stop_kernel(d.km, d.kc)


@pytest.fixture(scope="module")
def session(debug_specs: str) -> Iterator[Debug]:
    """One kernel for the module, with the debugger on (initialize, attach)."""
    d = _new_debug()
    d.start()
    yield d
    stop_kernel(d.km, d.kc)


# -- pure ------------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "expected"), VECTORS)
def test_murmur2_vectors(code: str, expected: int) -> None:
    assert cellnames.murmur2(code, SEED) == expected


def test_kernelspec_metadata_and_argv() -> None:
    spec = kernel_json(python="/x/python")
    assert spec["metadata"]["debugger"] is True
    argv = spec["argv"]
    assert argv[:4] == ["/x/python", "-Xfrozen_modules=off", "-m", "trikernel"]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(here, "kernelspec", "trikernel", "kernel.json")) as f:
        shipped = json.load(f)
    assert shipped["argv"] == kernel_json(python="python")["argv"]
    assert shipped["metadata"] == kernel_json(python="python")["metadata"]


def test_kernelspec_without_debugpy() -> None:
    import subprocess

    code = (
        "import sys; sys.modules['debugpy'] = None; from trikernel.launch.kernelspec import kernel_json; "
        "print(kernel_json()['metadata']['debugger'])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


# -- before the debugger starts -----------------------------------------------------------


#: Cell code defining ``_tracing()``: every way a debugger can trace this
#: process, by name; empty when nothing does. 3.11: sys.settrace and
#: threading.settrace (debugpy's way there); 3.12+: also every
#: sys.monitoring tool id (0-5) that is taken or has events on (debugpy's
#: way there, PEP 669: it sets no sys.gettrace()).
TRACE_PROBE = (
    "import sys, threading\n"
    "def _tracing():\n"
    "    found = []\n"
    "    if sys.gettrace() is not None:\n"
    "        found.append(f'sys.settrace {sys.gettrace()!r}')\n"
    "    if threading.gettrace() is not None:\n"
    "        found.append(f'threading.settrace {threading.gettrace()!r}')\n"
    "    mon = getattr(sys, 'monitoring', None)\n"
    "    for tool in range(6) if mon is not None else ():\n"
    "        if mon.get_tool(tool) is not None or mon.get_events(tool):\n"
    "            found.append(f'sys.monitoring tool {tool} {mon.get_tool(tool)!r} events {mon.get_events(tool):#x}')\n"
    "    return found\n"
)


def test_before_start_nothing_imported_or_traced(fresh: Debug) -> None:
    """No debugpy import, nothing tracing (TRACE_PROBE: on 3.12+ debugpy
    uses sys.monitoring, not sys.settrace) until the debugger is first
    turned on; cells have their murmur2 names (dumpCell's) from the first
    one on, as under ipykernel."""
    probe = TRACE_PROBE + "_state = ('debugpy' in sys.modules, not _tracing(), sys._getframe().f_code.co_filename)"
    assert fresh.run(probe)["status"] == "ok"
    assert fresh.run("print(_state[:2], _state[2])")["status"] == "ok"
    out = [m for m in fresh.iopub if m["msg_type"] == "stream"]
    before = out[-1]["content"]["text"].strip()
    fresh.start()
    path = fresh.ok("dumpCell", {"code": probe})["body"]["sourcePath"]
    assert before == f"(False, True) {path}"
    assert "/ipykernel_" in path
    assert fresh.run(probe)["status"] == "ok"
    assert fresh.run(f"assert _state[:2] == (True, False), _state\nassert _state[2] == {path!r}")["status"] == "ok"
    fresh.kc.kernel_info()
    info = fresh.kc.get_shell_msg(timeout=TIMEOUT)["content"]
    assert "debugger" in info["supported_features"]


def test_debug_info_before_start(fresh: Debug) -> None:
    msg_id, seq = fresh.send("debugInfo")
    r = fresh.reply(msg_id)
    assert r["success"]
    assert r["request_seq"] == seq
    assert r["type"] == "response"
    body = r["body"]
    assert body["isStarted"] is False
    assert body["hashMethod"] == "Murmur2"
    assert body["hashSeed"] == SEED
    assert body["tmpFilePrefix"].endswith(os.sep)
    assert body["tmpFileSuffix"] == ".py"
    assert body["breakpoints"] == []
    assert body["stoppedThreads"] == []
    assert body["richRendering"] is True
    assert body["copyToGlobals"] is True
    assert body["exceptionPaths"] == ["Python Exceptions"]
    # bracketed by busy/idle on IOPub, parented to the request (JupyterLab waits for idle)
    states = [m["content"]["execution_state"] for m in fresh.wait_idle(msg_id) if m["msg_type"] == "status"]
    assert states == ["busy", "idle"]


def test_dump_cell_paths_are_the_murmur2_names(fresh: Debug) -> None:
    prefix = fresh.ok("debugInfo")["body"]["tmpFilePrefix"]
    for code, h in VECTORS:
        path = fresh.ok("dumpCell", {"code": code})["body"]["sourcePath"]
        assert path == f"{prefix}{h}.py"
        with open(path, encoding="utf-8") as f:
            assert f.read() == code


def test_initialize_lists_exception_filters_and_attach(fresh: Debug) -> None:
    r = fresh.ok("initialize", INIT_ARGS)
    filters = {f["filter"] for f in r["body"]["exceptionBreakpointFilters"]}
    assert {"raised", "uncaught", "userUnhandled"} <= filters
    fresh.ok("attach")
    assert fresh.ok("debugInfo")["body"]["isStarted"] is True
    r = fresh.run("import sys\nprint('debugpy' in sys.modules)")
    assert r["status"] == "ok"
    assert fresh.ok("disconnect", {"restart": False, "terminateDebuggee": False})["success"]


def test_turning_on_during_a_long_cell_keeps_control_answering(fresh: Debug) -> None:
    """initialize while a cell computes: control answers meanwhile;
    initialize is answered once the cell ends (debugpy starts on the main thread)."""
    cell = fresh.kc.execute(
        "import time\nprint('STARTED', flush=True)\nt = time.monotonic()\nwhile time.monotonic() - t < 4: pass"
    )
    # wait until the cell runs
    while not any(m["msg_type"] == "stream" and "STARTED" in m["content"]["text"] for m in fresh.iopub):
        fresh._pull(time.monotonic() + TIMEOUT)
    init_id, _ = fresh.send("initialize", INIT_ARGS)
    info = fresh.kc.session.msg("kernel_info_request", {})
    fresh.kc.control_channel.send(info)
    order = []
    while len(order) < 2:
        r = fresh.kc.get_control_msg(timeout=TIMEOUT)
        order.append(r["msg_type"])
    assert order == ["kernel_info_reply", "debug_reply"]
    assert fresh.execute_reply(cell)["status"] == "ok"
    del init_id


def test_without_debugpy_clean_error_and_not_advertised(debug_specs: str) -> None:
    d = _new_debug("trikernel-nodebugpy")
    try:
        d.kc.kernel_info()
        info = d.kc.get_shell_msg(timeout=TIMEOUT)["content"]
        assert "debugger" not in info["supported_features"]
        r = d("initialize", INIT_ARGS)
        assert r["success"] is False
        assert "debugpy" in r["message"]
        assert d.run("1 + 1")["status"] == "ok"
    finally:
        stop_kernel(d.km, d.kc)


# -- breakpoints ---------------------------------------------------------------------------

CELLS = {
    "plain": ("a = 2\nb = a + 1\n", 2, "<module>"),
    "leading_blank_lines": ("\n\n\na = 2\nb = a + 1\n", 5, "<module>"),
    "top_level_await": ("import trio\nawait trio.sleep(0)\na = 2\nb = a + 1\n", 4, "<module>"),
    "async_def": ("async def g():\n    a = 2\n    await trio.sleep(0)\n    return a\n\nawait g()\n", 3, "g"),
    "nursery_task": (
        "import trikernel\nasync def job():\n    a = 2\n    await trio.sleep(0)\n    b = a + 1\n\n"
        "trikernel.nursery.start_soon(job)\n",
        4,
        "job",
    ),
}


@pytest.mark.parametrize("kind", list(CELLS))
def test_breakpoint_stops(session: Debug, kind: str) -> None:
    code, line, name = CELLS[kind]
    msg_id, path, tid = session.stop_at(code, line)
    frames = session.frames(tid)
    top = frames[0]
    assert top["source"]["path"] == path
    assert top["line"] == line
    assert top["name"] == name
    hidden = _machinery_dirs()
    assert not [f for f in frames if f.get("source", {}).get("path", "").startswith(hidden)], frames
    assert session.locals_of(top["id"])["a"]["value"] == "2"
    assert session.ok("debugInfo")["body"]["stoppedThreads"] == [tid]
    assert session.resume(tid, msg_id)["status"] == "ok"
    session.ok("setBreakpoints", {"breakpoints": [], "source": {"path": path}})


def test_breakpoint_in_a_thread_the_cell_starts(session: Debug) -> None:
    """A user thread stops alone; the main thread (joining it) is not stopped."""
    code = (
        "import threading\ndef work():\n    t1 = 2\n    t2 = t1 + 1\n\n"
        "th = threading.Thread(target=work, name='user-worker')\nth.start()\nth.join()\n"
    )
    msg_id, path, tid = session.stop_at(code, 4)
    threads = {t["id"]: t["name"] for t in session.ok("threads")["body"]["threads"]}
    assert threads[tid] == "user-worker"
    assert not any(name.startswith(("trikernel-", "Trio thread")) for name in threads.values()), threads
    top = session.frames(tid)[0]
    assert (top["name"], top["line"], top["source"]["path"]) == ("work", 4, path)
    assert session.ok("debugInfo")["body"]["stoppedThreads"] == [tid]
    assert session.resume(tid, msg_id)["status"] == "ok"
    session.ok("setBreakpoints", {"breakpoints": [], "source": {"path": path}})


def test_set_breakpoints_listed_in_debug_info(session: Debug) -> None:
    code = "x_listed = 1\ny_listed = 2\n"
    path = session.breakpoint(code, 2)
    bps = session.ok("debugInfo")["body"]["breakpoints"]
    assert {"source": path, "breakpoints": [{"line": 2}]} in bps
    session.ok("setBreakpoints", {"breakpoints": [], "source": {"path": path}})
    assert path not in [b["source"] for b in session.ok("debugInfo")["body"]["breakpoints"]]


def test_inspect_evaluate_copy_at_a_stop(session: Debug) -> None:
    code = "def f(a, b):\n    c = a + b\n    return c\n\nf(2, 3)\n"
    msg_id, _path, tid = session.stop_at(code, 3)
    frame = session.frames(tid)[0]
    local = session.locals_of(frame["id"])
    assert local["a"]["value"] == "2"
    assert local["c"]["value"] == "5"
    r = session.ok("richInspectVariables", {"variableName": "c", "frameId": frame["id"]})
    assert r["body"]["data"]["text/plain"] == "5"
    r = session.ok("evaluate", {"expression": "a + 40", "frameId": frame["id"], "context": "repl"})
    assert r["body"]["result"] == "42"
    session.ok("copyToGlobals", {"srcVariableName": "c", "dstVariableName": "c_copied", "srcFrameId": frame["id"]})
    assert session.resume(tid, msg_id)["status"] == "ok"
    r = session.run("assert c_copied == 5")
    assert r["status"] == "ok", r
    session.ok("setBreakpoints", {"breakpoints": [], "source": {"path": _path}})


def test_concurrent_requests_matched_by_request_seq(session: Debug) -> None:
    """Several requests in flight at once: each reply carries its own request_seq and answer."""
    code = "def h(k):\n    v = k * 10\n    return v\n\nh(7)\n"
    msg_id, path, tid = session.stop_at(code, 3)
    frame = session.frames(tid)[0]
    sent = {}
    for n in range(6):
        mid, seq = session.send("evaluate", {"expression": f"v + {n}", "frameId": frame["id"], "context": "repl"})
        sent[mid] = (seq, str(70 + n))
    ki = session.kc.session.msg("kernel_info_request", {})
    session.kc.control_channel.send(ki)
    for mid, (seq, value) in sent.items():
        r = session.reply(mid)
        assert r["request_seq"] == seq, r
        assert r["body"]["result"] == value, r
    assert session.resume(tid, msg_id)["status"] == "ok"
    session.ok("setBreakpoints", {"breakpoints": [], "source": {"path": path}})


def test_debug_requests_are_bracketed_one_at_a_time(session: Debug) -> None:
    """Back-to-back debug_requests each get busy, reply, idle before the next
    one's busy (ipykernel#1412, its test_debug_requests_sequential; JupyterLab's
    Variables panel went blank on busy, busy, idle, idle). Forwarded
    requests at a stop, so each waits on debugpy."""
    code = "def g(k):\n    w = k + 1\n    return w\n\ng(1)\n"
    msg_id, path, tid = session.stop_at(code, 3)
    frame = session.frames(tid)[0]
    ids = [session.send("evaluate", {"expression": f"w + {n}", "frameId": frame["id"]})[0] for n in range(3)]
    for mid in ids:
        session.reply(mid)
        session.wait_idle(mid)
    states = [
        (m["parent_header"]["msg_id"], m["content"]["execution_state"])
        for m in session.iopub
        if m["msg_type"] == "status" and m["parent_header"].get("msg_id") in ids
    ]
    assert states == [(mid, state) for mid in ids for state in ("busy", "idle")]
    assert session.resume(tid, msg_id)["status"] == "ok"
    session.ok("setBreakpoints", {"breakpoints": [], "source": {"path": path}})


def test_hidden_names_are_not_in_the_variables_panel_at_a_stop(session: Debug) -> None:
    """At a breakpoint in a cell's top level, its scopes show the user's
    names, not the kernel's hidden ones (``nursery``, ``trio``, IPython's
    ``In``/``Out``/``exit``), as the panel does while nothing is stopped."""
    code = "shown_here = 1\nshown_too = 2\n"
    msg_id, path, tid = session.stop_at(code, 2)
    frame = session.frames(tid)[0]
    names: set[str] = set()
    for scope in session.ok("scopes", {"frameId": frame["id"]})["body"]["scopes"]:
        variables = session.ok("variables", {"variablesReference": scope["variablesReference"]})["body"]["variables"]
        names |= {v["name"] for v in variables}
    assert "shown_here" in names
    assert not names & {"nursery", "trio", "In", "Out", "exit", "quit", "get_ipython", "_ih", "_oh", "_dh"}, names
    assert session.resume(tid, msg_id)["status"] == "ok"
    session.ok("setBreakpoints", {"breakpoints": [], "source": {"path": path}})


def test_step_in_next_continue(session: Debug) -> None:
    code = "def f2(a, b):\n    c = a + b\n    return c\n\nf2(2, 3)\n"
    msg_id, path, tid = session.stop_at(code, 5)
    session.ok("stepIn", {"threadId": tid})
    stopped = session.wait_event("stopped")
    assert stopped["body"]["reason"] == "step"
    top = session.frames(tid)[0]
    assert (top["name"], top["line"]) == ("f2", 2)
    session.ok("next", {"threadId": tid})
    session.wait_event("stopped")
    assert session.frames(tid)[0]["line"] == 3
    assert session.resume(tid, msg_id)["status"] == "ok"
    session.ok("setBreakpoints", {"breakpoints": [], "source": {"path": path}})


def test_exception_breakpoint(session: Debug) -> None:
    session.ok("setExceptionBreakpoints", {"filters": ["raised"]})
    try:
        code = "3 * undefined_name\n"
        session.ok("dumpCell", {"code": code})
        msg_id = session.kc.execute(code)
        stopped = session.wait_event("stopped")
        assert stopped["body"]["reason"] == "exception"
        tid = stopped["body"]["threadId"]
        assert session.frames(tid)[0]["line"] == 1
        info = session.ok("exceptionInfo", {"threadId": tid})
        assert "NameError" in info["body"]["exceptionId"]
        reply = session.resume(tid, msg_id)
        assert reply["status"] == "error"
        assert reply["ename"] == "NameError"
    finally:
        session.ok("setExceptionBreakpoints", {"filters": []})


def test_kernel_serves_while_stopped(session: Debug) -> None:
    """Stopped at a breakpoint (main thread): control and heartbeat answer; a
    queued execute runs after continue."""
    msg_id, path, tid = session.stop_at("s = 1\ns = 2\n", 2)
    # the main thread stays stopped until continue below: any answer shows the io run is not stopped
    session.kc.control_channel.send(session.kc.session.msg("kernel_info_request", {}))
    assert session.kc.get_control_msg(timeout=TIMEOUT)["msg_type"] == "kernel_info_reply"
    ctx = zmq.Context.instance()
    hb = ctx.socket(zmq.REQ)
    hb.linger = 0
    hb.connect(f"tcp://127.0.0.1:{session.km.hb_port}")
    hb.send(b"ping")
    assert hb.poll(TIMEOUT * 1000), "heartbeat did not answer while stopped"
    assert hb.recv() == b"ping"
    hb.close()
    queued = session.kc.execute("queued_ran = s")
    assert session.resume(tid, msg_id)["status"] == "ok"
    assert session.execute_reply(queued)["status"] == "ok"
    assert session.run("assert queued_ran == 2")["status"] == "ok"
    session.ok("setBreakpoints", {"breakpoints": [], "source": {"path": path}})


def _control_reply_first(session: Debug, pending: str) -> None:
    """kernel_info on control is answered while the debug request ``pending`` is
    still unanswered: its reply is the next control message (ordering, not time)."""
    ki = session.kc.session.msg("kernel_info_request")
    session.kc.control_channel.send(ki)
    first = session.kc.get_control_msg(timeout=TIMEOUT)
    assert first["parent_header"]["msg_id"] == ki["header"]["msg_id"], first["msg_type"]
    assert pending not in session.early


def test_inspect_variables_while_a_cell_runs_waits_for_it(session: Debug, tmp_path: Any) -> None:
    """Issue 26.2: the listing is taken in the user run, so while a cell computes
    it waits for the cell (docs/debugger.md, "While a cell runs") and lists the
    values the cell left; control answers meanwhile."""
    flag = tmp_path / "go"
    session.run("inspected_name = 41")
    cell = session.kc.execute(
        f"import os\nprint('STARTED', flush=True)\nwhile not os.path.exists({str(flag)!r}): pass\ninspected_name = 42"
    )
    while not any(m["msg_type"] == "stream" and "STARTED" in m["content"]["text"] for m in session.iopub):
        session._pull(time.monotonic() + TIMEOUT)
    pending, _ = session.send("inspectVariables")
    _control_reply_first(session, pending)
    flag.write_text("")
    r = session.reply(pending)
    assert r["success"], r
    names = {v["name"]: v for v in r["body"]["variables"]}
    assert names["inspected_name"]["value"] == "42"  # taken after the cell
    assert "get_ipython" not in names
    assert "In" not in names
    rich = session.ok("richInspectVariables", {"variableName": "inspected_name"})
    assert rich["body"]["data"]["text/plain"] == "42"
    assert session.execute_reply(cell)["status"] == "ok"


SLOW_REPR = (
    "import time\n"
    "class Slow:\n"
    "    def __repr__(self):\n"
    "        print('IN_REPR', flush=True)\n"
    "        time.sleep(10)\n"
    "        return 'slow'\n"
    "    _repr_html_ = __repr__\n"
    "slow = Slow()\n"
)


def test_a_slow_repr_costs_its_request_not_the_kernel(fresh: Debug) -> None:
    """A 10 s ``__repr__`` in user_ns: control answers while an inspectVariables and a
    richInspectVariables wait for it (before, the repr ran on the io thread and
    control, shell, stdin and IOPub stopped for 10 s); an interrupt ends the repr,
    and then a running cell."""
    fresh.start()
    marker = fresh.kc.execute(SLOW_REPR + "print('DEFINED')")
    assert fresh.execute_reply(marker)["status"] == "ok"
    pending, _ = fresh.send("inspectVariables")
    _control_reply_first(fresh, pending)
    r = fresh.reply(pending)  # within the deadline of the panel, the repr still running
    assert r["success"], r
    assert [v["name"] for v in r["body"]["variables"]] == ["…"]  # nothing listed before: a placeholder
    pending, _ = fresh.send("richInspectVariables", {"variableName": "slow"})
    _control_reply_first(fresh, pending)
    r = fresh.reply(pending)
    assert r["success"] is False  # the first repr still runs: this one could not wait for it
    # once the rich job's own repr runs (the second IN_REPR), an interrupt ends it
    # (a job of the user run is interrupted as a cell is)
    while _printed(fresh, "IN_REPR") < 2:
        fresh._pull(time.monotonic() + TIMEOUT)
    fresh.km.interrupt_kernel()
    cell = fresh.kc.execute("print('STARTED', flush=True)\nimport time\nwhile True: time.sleep(0.01)")
    while not any(m["msg_type"] == "stream" and "STARTED" in m["content"]["text"] for m in fresh.iopub):
        fresh._pull(time.monotonic() + TIMEOUT)
    pending, _ = fresh.send("inspectVariables")
    _control_reply_first(fresh, pending)
    fresh.km.interrupt_kernel()
    reply = fresh.execute_reply(cell)
    assert reply["status"] == "error"
    assert reply["ename"] == "KeyboardInterrupt"
    assert fresh.reply(pending)["success"]  # the listing, or a placeholder past the deadline
    assert _printed(fresh, "IN_REPR") <= 3  # the interrupted rich job formatted nothing more


def _printed(session: Debug, text: str) -> int:
    return sum(text in m["content"]["text"] for m in session.iopub if m["msg_type"] == "stream")


def test_a_raising_repr_gives_a_placeholder(session: Debug) -> None:
    code = (
        "class Bad:\n"
        "    def __repr__(self): raise ValueError('no repr')\n"
        "    def _repr_html_(self): raise ValueError('no html')\n"
        "class NoClass:\n"
        "    @property\n"
        "    def __class__(self): raise RuntimeError('no class')\n"
        "    @property\n"
        "    def __dict__(self): raise RuntimeError('no dict')\n"
        "bad, no_class, fine = Bad(), NoClass(), [1, 2]\n"
    )
    assert session.run(code)["status"] == "ok"
    names = {v["name"]: v for v in session.ok("inspectVariables")["body"]["variables"]}
    assert names["bad"]["value"] == "<repr failed: ValueError>"
    assert names["bad"]["type"] == "Bad"
    assert names["no_class"]["value"].startswith("<repr failed: RuntimeError>"), names["no_class"]
    assert names["fine"]["value"] == "[1, 2]"
    children = session.ok("variables", {"variablesReference": names["fine"]["variablesReference"]})
    assert [v["value"] for v in children["body"]["variables"]] == ["1", "2"]
    rich = session.ok("richInspectVariables", {"variableName": "bad"})
    assert rich["body"]["data"]["text/plain"] == "<repr failed>"
    assert "text/html" not in rich["body"]["data"]


def test_objects_the_panel_held_are_released_in_the_user_run(session: Debug) -> None:
    """The Variables panel keeps references to what it listed (for ``variables``);
    the last one dropped runs ``__del__``: in the user run, never on the io thread."""
    code = (
        "import threading\n"
        "where = []\n"
        "class Canary:\n"
        "    def __init__(self): self.x = 1\n"
        "    def __del__(self): where.append(threading.current_thread().name)\n"
        "canary = Canary()\n"
    )
    assert session.run(code)["status"] == "ok"
    names = {v["name"]: v for v in session.ok("inspectVariables")["body"]["variables"]}
    assert names["canary"]["variablesReference"] > 0  # held by the panel
    assert session.run("del canary")["status"] == "ok"
    session.ok("inspectVariables")  # a new listing drops the old references
    assert session.run("assert where == ['MainThread'], where")["status"] == "ok"


def test_modules_and_source(session: Debug) -> None:
    r = session.ok("modules", {"startModule": 0, "moduleCount": 0})
    assert r["body"]["totalModules"] > 10
    assert any(m["name"] == "trio" for m in r["body"]["modules"])
    code = "source_me = 1\n"
    path = session.ok("dumpCell", {"code": code})["body"]["sourcePath"]
    assert session.ok("source", {"source": {"path": path}})["body"]["content"] == code
    r = session("source", {"source": {"path": "/nonexistent/x.py"}})
    assert r["success"] is False


def test_disconnect_then_attach_again(fresh: Debug) -> None:
    fresh.start()
    code = "r1 = 1\nr2 = 2\n"
    msg_id, _path, tid = fresh.stop_at(code, 2)
    assert fresh.resume(tid, msg_id)["status"] == "ok"
    # terminateDebuggee true would kill the kernel: never forwarded
    assert fresh.ok("disconnect", {"restart": False, "terminateDebuggee": True})["success"]
    assert fresh.km.is_alive()
    info = fresh.ok("debugInfo")["body"]
    assert info["isStarted"] is False
    assert info["breakpoints"] == []
    # nothing traces any more, on every Python (TRACE_PROBE); the disconnect job runs before this cell
    reply = fresh.run(TRACE_PROBE + "assert not _tracing(), _tracing()")
    assert reply["status"] == "ok", reply.get("evalue")
    fresh.start()
    msg_id, _, tid = fresh.stop_at(code, 2)
    assert fresh.resume(tid, msg_id)["status"] == "ok"
    # attached again, a thread the cell starts is traced again (3.11: threading.settrace back)
    threaded = (
        "import threading\ndef again():\n    a1 = 2\n    a2 = a1 + 1\n\n"
        "th = threading.Thread(target=again, name='after-reattach')\nth.start()\nth.join()\n"
    )
    msg_id, _, tid = fresh.stop_at(threaded, 4)
    assert {t["id"]: t["name"] for t in fresh.ok("threads")["body"]["threads"]}[tid] == "after-reattach"
    assert fresh.resume(tid, msg_id)["status"] == "ok"


# -- faults ipykernel has ------------------------------------------------------------------


def test_interrupt_while_stopped_keeps_the_debugger_working(fresh: Debug) -> None:
    """ipykernel#821: after an interrupt at a breakpoint, the next run stops again."""
    fresh.start()
    code = "i1 = 1\ni2 = 2\n"
    msg_id, _path, _tid = fresh.stop_at(code, 2)
    fresh.km.interrupt_kernel()
    reply = fresh.execute_reply(msg_id)
    assert reply["status"] == "error", reply
    assert reply["ename"] == "KeyboardInterrupt", reply
    fresh.wait_idle(msg_id)
    msg_id = fresh.kc.execute(code)
    stopped = fresh.wait_event("stopped")
    assert stopped["body"]["reason"] == "breakpoint"
    tid = stopped["body"]["threadId"]
    assert fresh.frames(tid)[0]["line"] == 2
    assert fresh.resume(tid, msg_id)["status"] == "ok"


def test_second_continue_does_not_wedge(fresh: Debug) -> None:
    """ipykernel#1255: a second continue while the first is pending is answered
    and the kernel keeps serving."""
    fresh.start()
    msg_id, _path, tid = fresh.stop_at("d1 = 1\nd2 = 2\n", 2)
    first, _ = fresh.send("continue", {"threadId": tid})
    second, _ = fresh.send("continue", {"threadId": tid})
    assert fresh.reply(first)["success"]
    assert fresh.reply(second)["success"]
    assert fresh.execute_reply(msg_id)["status"] == "ok"
    fresh.kc.kernel_info()
    assert fresh.kc.get_shell_msg(timeout=TIMEOUT)["msg_type"] == "kernel_info_reply"
    assert fresh.run("d3 = d2 + 1")["status"] == "ok"
    assert fresh.ok("debugInfo")["body"]["stoppedThreads"] == []


def test_breakpoint_builtin_stops_while_the_debugger_is_on(fresh: Debug) -> None:
    """``breakpoint()`` as in ipykernel, whose ``sys.breakpointhook`` is
    debugpy's from start-up: nothing while no client is attached, a stop in
    the visual debugger while one is, nothing again after disconnect."""
    assert fresh.run("breakpoint()\nbp_off = 1")["status"] == "ok"
    fresh.start()
    code = "bp_a = 2\nbreakpoint()\nbp_b = bp_a + 1\n"
    path = fresh.ok("dumpCell", {"code": code})["body"]["sourcePath"]
    msg_id = fresh.kc.execute(code)
    stopped = fresh.wait_event("stopped")
    tid = stopped["body"]["threadId"]
    frames = fresh.frames(tid)
    top = frames[0]
    assert (top["source"]["path"], top["name"]) == (path, "<module>"), frames
    assert top["line"] == 3, top  # the line after the call, as debugpy stops in ipykernel
    assert not [f for f in frames if f.get("source", {}).get("path", "").startswith(_machinery_dirs())], frames
    assert fresh.locals_of(top["id"])["bp_a"]["value"] == "2"
    assert fresh.resume(tid, msg_id)["status"] == "ok"
    assert fresh.ok("disconnect", {"restart": False, "terminateDebuggee": False})["success"]
    assert fresh.run("breakpoint()\nbp_after = 1")["status"] == "ok"


def test_a_breakpointhook_the_user_set_survives_the_debugger(fresh: Debug) -> None:
    """debugpy's import installs its hook; one the user set before stays."""
    assert fresh.run("import sys\ncalls = []\nsys.breakpointhook = lambda *a: calls.append(a)")["status"] == "ok"
    fresh.start()
    assert fresh.run("breakpoint(7)\nassert calls == [(7,)], calls")["status"] == "ok"
