"""Shared fixtures: real kernels in subprocesses, real jupyter_client clients.

Every message a client fixture receives is validated against
jupyter_kernel_test's message schemas (msgspec_v5), so a test that reads a
message also checks its shape.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import zmq
import zmq.sugar.context as zmq_context_module
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from jupyter_kernel_test.msgspec_v5 import msg_structure_validator, schema_fragments, validate_message

from trikernel.launch.cli import EXIT_RUNTIME

if TYPE_CHECKING:
    from collections.abc import Iterator

# A suite started in the background (`pytest &` in a script, nohup) inherits SIGINT
# ignored, and Python then installs no KeyboardInterrupt handler: the in-process
# interrupt tests and the kernels the tests start (they inherit the ignored
# disposition across exec) would never see an interrupt. Give them Python's default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TIMEOUT = 30
#: s a kernel may take to answer its first kernel_info (start_kernel, wait_ready)
START_TIMEOUT = 60.0
#: starts start_kernel makes when another worker took a port in between
START_ATTEMPTS = 3


def _no_linger_by_default() -> None:
    """Sockets made in the test process default to LINGER 0.

    A socket left for the garbage collector is closed with its own linger,
    libzmq's default -1: messages queued for a peer that is gone (a killed
    kernel) then keep ``zmq_ctx_term`` waiting for good, and the collector
    runs ``Context.__del__`` (``destroy`` → ``term``) inside whatever test
    is running at the time, in C, where pytest-timeout's signal cannot end
    it (seen once: a worker hung in test_iopub_queue.py for a context of an
    earlier test). Sockets that set their own linger (jupyter_client's
    1000 ms) keep it. Kernels run in their own processes: not affected.
    """
    init = zmq.Context.__init__

    def __init__(self: zmq.Context[Any], *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.setsockopt(zmq.LINGER, 0)

    zmq.Context.__init__ = __init__  # type: ignore[method-assign]


_no_linger_by_default()


def _no_term_from_the_collector() -> None:
    """A Context the garbage collector finds is terminated on a thread of its own.

    ``Context.__del__`` calls ``destroy``, which closes the sockets it still
    tracks and then ``term``. When the context and a socket of it are
    garbage in one reference cycle, the collector clears the weak set of
    sockets before it calls ``__del__``: the socket is not closed, and
    ``term`` waits for it for good (pyzmq#1167), in C, where
    pytest-timeout's signal cannot end it. Seen here: a worker hung in
    ``Context.term`` under ``__del__`` during an import in
    test_gateway_gp.py, and so held the whole run. Here ``__del__`` closes
    what it tracks (LINGER 0) and hands ``term`` to a daemon thread: the
    collector then frees the rest of the cycle, the socket's own
    ``__del__`` closes it, and ``term`` returns (200 such cycles: no hang,
    no fd left; leaving the context open instead kept 5 fds per context,
    and a CI run's client then failed with "Too many open files").
    Kernels run in their own processes: not affected.
    """

    def __del__(self: zmq.Context[Any]) -> None:
        if getattr(self, "_shadow", False) or self.closed or zmq_context_module._exiting:
            return  # pyzmq's own rule: nothing at process exit
        for sock in list(getattr(self, "_sockets", None) or ()):
            if not sock.closed:
                sock.close(linger=0)
        threading.Thread(target=self.term, name="zmq-term-from-gc", daemon=True).start()

    zmq.Context.__del__ = __del__  # type: ignore[method-assign]


_no_term_from_the_collector()

#: s a test waits for the suite lock: an exclusive test, just over the longest
#: test timeout (600 s); a shared one, that plus the exclusive test's own run
EXCLUSIVE_LOCK_WAIT = 660.0
SHARED_LOCK_WAIT = 2 * EXCLUSIVE_LOCK_WAIT


def _suite_lock_files() -> tuple[str, str] | None:
    """The gate and room lock files shared by this run's pytest-xdist workers
    (``PYTEST_XDIST_TESTRUNUID`` names the run); None when not under xdist."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return None
    base = os.path.join(tempfile.gettempdir(), f"trikernel-tests-{run}")
    return base + "-gate.lock", base + "-room.lock"


def _flock(f: Any, how: int, deadline: float) -> bool:
    """Take the flock ``how`` on ``f``; False if ``deadline`` passed first."""
    while True:
        try:
            fcntl.flock(f, how | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A test marked ``exclusive`` runs with no other test of the run beside it.

    The crowd tests start 40 kernels at once on a 2-core machine; beside
    them, other workers' tests with 5-30 s deadlines failed on loaded CI
    runners (an interrupt answered late, a started task cut by the 1 ms
    end-of-cell bound). Every test holds the "room" lock shared; an
    exclusive one holds it alone. The "gate" gives the exclusive test
    priority: it closes the gate while it waits, so no new test enters the
    room ahead of it. Outermost hook (``tryfirst``), so the wait is not
    counted in pytest-timeout's budget of either test.
    """
    files = _suite_lock_files()
    if files is None:
        yield
        return
    exclusive = item.get_closest_marker("exclusive") is not None
    wait = EXCLUSIVE_LOCK_WAIT if exclusive else SHARED_LOCK_WAIT
    deadline = time.monotonic() + wait
    with open(files[0], "a") as gate, open(files[1], "a") as room:
        # a missed deadline (a test stuck in C holds the room) runs the test
        # unlocked, with a warning: raising here would end the whole run
        locked = _flock(gate, fcntl.LOCK_EX, deadline)
        try:
            locked = locked and _flock(room, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, deadline)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        if not locked:
            item.warn(pytest.PytestWarning(f"the suite lock was not free within {wait:.0f} s: run without it"))
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the item (``item.rep_setup``, ``rep_call``,
    ``rep_teardown``): a fixture shared by several tests reads in its teardown
    whether the test failed (:func:`failed`)."""
    outcome = yield
    setattr(item, f"rep_{call.when}", outcome.get_result())


def failed(request: pytest.FixtureRequest) -> bool:
    """Whether the test ``request`` belongs to failed in its setup or its call
    (read in a function-scoped fixture's teardown)."""
    return any(getattr(getattr(request.node, f"rep_{when}", None), "failed", False) for when in ("setup", "call"))


COMM_TYPES = frozenset({"comm_open", "comm_msg", "comm_close"})
DEBUG_TYPES = frozenset({"debug_request", "debug_reply", "debug_event"})


class ValidatingClient(BlockingKernelClient):
    """A BlockingKernelClient that schema-validates every message it reads."""

    def _check(self, msg: dict[str, Any]) -> dict[str, Any]:
        if msg["msg_type"] == "iopub_welcome":
            # JEP 65; not in msgspec_v5. Check its one field by hand.
            assert isinstance(msg["content"]["subscription"], str)
        elif msg["msg_type"] == "input_request":
            # msgspec_v5 types `password` as "number"; the messaging spec
            # (and every frontend) says boolean. We send the spec's bool and
            # validate the rest of the message against msgspec_v5.
            assert isinstance(msg["content"]["password"], bool)
            validate_message(
                {**msg, "content": {**msg["content"], "password": int(msg["content"]["password"])}}, "input_request"
            )
        elif msg["msg_type"] in COMM_TYPES:
            # msgspec_v5 has no comm schemas: header/structure from it, content by the spec
            msg_structure_validator.validate(msg)
            c = msg["content"]
            assert isinstance(c["comm_id"], str)
            assert isinstance(c["data"], dict)
            if msg["msg_type"] == "comm_open":
                assert isinstance(c["target_name"], str)
        elif msg["msg_type"] in DEBUG_TYPES:
            # msgspec_v5 has no debug schemas: the DAP shapes of trikernel/protocol/msgspec.py
            # (spec "Debug request", "Debug event"; DAP ProtocolMessage/Response/Event)
            from trikernel.protocol import msgspec

            msg_structure_validator.validate(msg)
            bad = msgspec.validate_content(msg["msg_type"], msg["content"])
            assert not bad, (msg["msg_type"], [str(v) for v in bad], msg["content"])
        elif msg["msg_type"] not in schema_fragments:
            # a reply msgspec_v5 has no schema for (usage_reply, the error
            # reply to an unknown request): structure from it, content by the spec
            msg_structure_validator.validate(msg)
            c = msg["content"]
            assert c["status"] in ("ok", "error"), c
            if c["status"] == "error":
                assert isinstance(c["ename"], str)
                assert isinstance(c["evalue"], str)
                assert isinstance(c["traceback"], list)
        else:
            validate_message(msg, msg["msg_type"])
        return msg

    def get_shell_msg(self, *a: Any, **kw: Any) -> dict[str, Any]:  # type: ignore[override]
        return self._check(super().get_shell_msg(*a, **kw))

    def get_iopub_msg(self, *a: Any, **kw: Any) -> dict[str, Any]:  # type: ignore[override]
        return self._check(super().get_iopub_msg(*a, **kw))

    def get_control_msg(self, *a: Any, **kw: Any) -> dict[str, Any]:  # type: ignore[override]
        return self._check(super().get_control_msg(*a, **kw))

    def get_stdin_msg(self, *a: Any, **kw: Any) -> dict[str, Any]:  # type: ignore[override]
        return self._check(super().get_stdin_msg(*a, **kw))


def install_kernelspec(prefix: Any, name: str, *flags: str) -> str:
    """``python -m trikernel install --prefix PREFIX --name NAME FLAGS...`` as a
    user would run it; returns the JUPYTER_PATH entry that holds the spec."""
    import subprocess

    r = subprocess.run(
        [sys.executable, "-m", "trikernel", "install", "--prefix", str(prefix), "--name", name, *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return os.path.join(str(prefix), "share", "jupyter")


def make_kernelspec(
    root: str, name: str, *, interrupt_mode: str = "signal", extra_argv: list[str] | None = None
) -> str:
    d = os.path.join(root, "kernels", name)
    os.makedirs(d, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "trikernel", "-f", "{connection_file}", *(extra_argv or [])],
        "display_name": name,
        "language": "python",
        "interrupt_mode": interrupt_mode,
        "kernel_protocol_version": "5.5",
        "metadata": {"supported_encryption": ["curve"]},
    }
    with open(os.path.join(d, "kernel.json"), "w") as f:
        json.dump(spec, f)
    return d


@contextlib.contextmanager
def env_set(name: str, value: str, *, prepend_path: bool = False) -> Iterator[str]:
    """Set environment variable ``name`` to ``value`` (``prepend_path``: put
    ``value`` first on the path list it holds) for the ``with`` block, then
    put back what was there; kernels started meanwhile inherit it."""
    old = os.environ.get(name)
    os.environ[name] = value + (os.pathsep + old if prepend_path and old else "")
    try:
        yield value
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@pytest.fixture(scope="session", autouse=True)
def _isolated_ipython_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Every kernel of the run gets a fresh IPYTHONDIR (history database,
    profile) instead of the user's ~/.ipython, whose history holds the
    cells of other runs; test_jupyter_kernel_test.py gives its kernel one
    of its own, since its history search counts every match."""
    with env_set("IPYTHONDIR", str(tmp_path_factory.mktemp("ipython"))) as root:
        yield root


@pytest.fixture(scope="session")
def jupyter_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A JUPYTER_PATH entry holding test kernelspecs (signal and message interrupt modes)."""
    root = str(tmp_path_factory.mktemp("jupyter"))
    make_kernelspec(root, "trikernel-test-signal", interrupt_mode="signal")
    make_kernelspec(root, "trikernel-test-message", interrupt_mode="message")
    with env_set("JUPYTER_PATH", root, prepend_path=True):
        yield root


def _alive_of(km: Any) -> Any:
    """A liveness test that never asks the heartbeat: the kernel process's
    (``km.is_alive()``), or True when the test has no handle on it."""
    if km is None:
        return lambda: True
    if hasattr(km, "poll"):  # a subprocess.Popen
        return lambda: km.poll() is None
    return km.is_alive


def _exit_code(km: Any) -> int | None:
    proc = km if hasattr(km, "poll") else getattr(getattr(km, "provisioner", None), "process", None)
    return proc.poll() if proc is not None else None


class NoAnswer(RuntimeError):
    """A live kernel left our kernel_info on shell unanswered past the deadline."""


def _wait_shell_ready(km: Any, kc: BlockingKernelClient, timeout: float, *, evidence: bool = True) -> None:
    """Ready as jupyter console decides it: a ``kernel_info_reply`` on shell,
    with no IOPub channel at all. Raises RuntimeError, as wait_for_ready does,
    naming the exit code when the kernel process is gone, and NoAnswer when
    it runs but did not answer within ``timeout``: with ``evidence``, the
    message then holds what the kernel still does (:func:`kernel_evidence`)."""
    alive = _alive_of(km)
    msg_id = kc.kernel_info()
    start = time.monotonic()
    deadline = start + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"Kernel died before replying to kernel_info (exit code {_exit_code(km)})")
        try:
            r = kc.get_shell_msg(timeout=0.2)
        except queue.Empty:
            continue
        if r["parent_header"].get("msg_id") == msg_id:
            return
    what = f"Kernel didn't respond in {timeout:.1f} seconds: kernel_info {msg_id} on shell"
    raise NoAnswer(what + ("\n" + kernel_evidence(km, kc, msg_id) if evidence else ""))


def wait_ready(km: Any, kc: BlockingKernelClient, timeout: float = START_TIMEOUT) -> None:
    """jupyter_client's wait_for_ready without its stale replies and without
    the heartbeat: a ``kernel_info_reply`` to *our* request on shell, then a
    message on IOPub (trikernel welcomes each subscriber, JEP 65, and holds
    what it published before one came: docs/iopub.md); one more round each
    second until IOPub speaks. ``km``: a KernelManager, a subprocess.Popen or
    None, asked whether the kernel still runs (never the heartbeat).

    Why not wait_for_ready: it sends a new kernel_info whenever one goes
    unanswered for a second, so under load it left replies queued on shell,
    and a test's next ``get_shell_msg`` read one (CI: a reply to an earlier
    kernel_info where an execute_reply was expected); and a client made
    without a KernelManager decides "Kernel died before replying to
    kernel_info" from a heartbeat missed for 1 s, which a starved machine
    misses (issue 26). Raises RuntimeError as wait_for_ready does; a missed
    deadline says which channel missed it, with :func:`kernel_evidence`
    (a later round's kernel_info cut short by the deadline is IOPub's
    failure, not shell's: shell answered the first one)."""
    deadline = time.monotonic() + timeout
    rounds = 0
    while True:
        try:
            _wait_shell_ready(km, kc, max(0.1, deadline - time.monotonic()), evidence=rounds == 0)
        except NoAnswer as exc:
            if rounds == 0:
                raise
            raise RuntimeError(
                f"IOPub did not connect within {timeout} seconds (shell answered {rounds} kernel_info; "
                f"the last was cut short by the deadline: {exc})\n" + kernel_evidence(km, kc)
            ) from None
        rounds += 1
        try:
            kc.get_iopub_msg(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            return
        except queue.Empty:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"IOPub did not connect within {timeout} seconds (shell answered {rounds} kernel_info)\n"
                    + kernel_evidence(km, kc)
                ) from None


#: s each probe of kernel_evidence waits for its answer
PROBE_TIMEOUT = 10.0


def kernel_evidence(km: Any, kc: BlockingKernelClient, unanswered: str | None = None) -> str:
    """What a live kernel that missed a readiness deadline still does, as text
    for the failure message (CI saw a fresh kernel leave kernel_info on
    shell unanswered for 60 s once, under load, with nothing in its log):

    - kernel_info on control from this client;
    - with ``unanswered`` (the msg_id of a kernel_info on shell): a second one
      on shell from the same client, and which of the two are answered.
      Both: the first sat unread until new traffic woke the shell reader (a
      lost ``ZMQ_FD`` wake-up). Neither: the reader, or our connection's
      route, is stuck;
    - kernel_info on shell and on control from a fresh client with its own
      DEALER identity: does the io run serve at all? Answered while ours is
      not points at our connection (e.g. a second connection of our
      identity: libzmq refuses it for good, ROUTER_HANDOVER is off,
      docs/design.md "Sockets");
    - the TCP connections of the kernel and of this process to its ports;
    - every thread's stack, Python and native (``py-spy dump --native``, where
      py-spy is installed).

    Takes up to about 5 * PROBE_TIMEOUT; never raises.
    """
    lines = []

    def step(name: str, fn: Any) -> None:
        try:
            lines.append(f"{name}: {fn()}")
        except Exception as exc:
            lines.append(f"{name}: probe failed: {exc!r}")

    pid = _kernel_pid(km, kc)
    lines.append(f"kernel pid {pid}, exit code {_exit_code(km) if km is not None else '?'}")
    step("kernel_info on control", lambda: _probe(kc, "control"))
    if unanswered is not None:
        step("a second kernel_info on shell", lambda: _probe_shell_again(kc, unanswered))
    step("kernel_info from a fresh client", lambda: _probe_fresh_client(kc))
    step("connections", lambda: _connections(pid, kc))
    step("stacks", lambda: _stacks(pid))
    return "\n".join(lines)


def _kernel_pid(km: Any, kc: BlockingKernelClient) -> int | None:
    """The kernel's pid: from its KernelManager or Popen, else the process listening on its shell port."""
    proc = km if hasattr(km, "pid") else getattr(getattr(km, "provisioner", None), "process", None)
    if proc is not None:
        return int(proc.pid)
    import psutil

    for c in psutil.net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == kc.shell_port:
            return c.pid
    return None


def _probe(kc: BlockingKernelClient, channel: str) -> str:
    msg = kc.session.msg("kernel_info_request")
    getattr(kc, f"{channel}_channel").send(msg)
    got = _replies_to(getattr(kc, f"{channel}_channel"), {msg["header"]["msg_id"]}, PROBE_TIMEOUT)
    return "answered" if got else f"no answer in {PROBE_TIMEOUT:g} s"


def _replies_to(channel: Any, msg_ids: set[str], timeout: float) -> set[str]:
    """Which of ``msg_ids`` get a reply on ``channel`` within ``timeout`` (raw, not validated)."""
    got: set[str] = set()
    deadline = time.monotonic() + timeout
    while got != msg_ids and time.monotonic() < deadline:
        try:
            r = channel.get_msg(timeout=0.2)
        except queue.Empty:
            continue
        parent = r["parent_header"].get("msg_id")
        if parent in msg_ids:
            got.add(parent)
    return got


def _probe_shell_again(kc: BlockingKernelClient, first: str) -> str:
    msg = kc.session.msg("kernel_info_request")
    kc.shell_channel.send(msg)
    second = msg["header"]["msg_id"]
    got = _replies_to(kc.shell_channel, {first, second}, PROBE_TIMEOUT)
    said = {True: "answered", False: "unanswered"}
    return f"the first {said[first in got]}, the second {said[second in got]}"


def _probe_fresh_client(kc: BlockingKernelClient) -> str:
    other = BlockingKernelClient()
    other.load_connection_info(kc.get_connection_info())  # same key, a new Session: its own identity
    other.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=True)
    try:
        return f"shell {_probe(other, 'shell')}, control {_probe(other, 'control')}"
    finally:
        other.stop_channels()


def _connections(pid: int | None, kc: BlockingKernelClient) -> str:
    """Each of the kernel's ports: the kernel's TCP sockets on it and this process's to it."""
    import psutil

    ports = {getattr(kc, f"{c}_port"): c for c in ("shell", "iopub", "stdin", "control", "hb")}

    def conns(p: psutil.Process) -> list[Any]:
        get = getattr(p, "net_connections", None) or p.connections
        return list(get(kind="tcp"))

    out = []
    for who, proc in (("kernel", psutil.Process(pid) if pid else None), ("client", psutil.Process())):
        if proc is None:
            continue
        for c in conns(proc):
            port = c.laddr.port if who == "kernel" else (c.raddr.port if c.raddr else None)
            if port in ports:
                peer = f"{c.raddr.port}" if c.raddr else "-"
                out.append(f"{who} {ports[port]} {c.laddr.port}<->{peer} {c.status}")
    return "; ".join(sorted(out)) or "none"


def _stacks(pid: int | None) -> str:
    """``py-spy dump --native`` of ``pid``: every thread's stack (where py-spy is installed)."""
    if pid is None:
        return "no pid"
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        return "py-spy is not installed (pip install py-spy): no stacks"
    import subprocess

    r = subprocess.run([spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    return "\n" + (r.stdout + r.stderr).strip()


def start_kernel(
    kernel_name: str = "trikernel",
    *,
    stderr: Any = None,
    env: dict[str, str] | None = None,
    iopub: bool = True,
    stdin: bool = True,
    **km_kwargs: Any,
) -> tuple[KernelManager, ValidatingClient]:
    """A ready kernel and a started ValidatingClient; ``stderr``: a file for the
    kernel log; ``env``: the kernel's whole environment (default: this process's);
    ``iopub=False``: the client's IOPub channel is not started (it is made
    and subscribes when ``kc.iopub_channel`` is first used), and readiness is
    a ``kernel_info_reply`` on shell alone; ``stdin=False``: likewise, the
    stdin channel is not started.

    Started classic-way (jupyter_client picks the ports, then the kernel binds
    them), so a kernel another test worker starts at the same moment can take
    a port in between: trikernel then exits 1 at once, naming the port
    (EXIT_RUNTIME). That race (the one the JEP 66 handshake removes, and
    test_crowd provokes on purpose) gets another start with fresh ports, up
    to START_ATTEMPTS in all; any other failure is raised. Readiness may
    take START_TIMEOUT (IPython's import on a machine at load 15).
    """
    for attempt in range(1, START_ATTEMPTS + 1):
        km = KernelManager(kernel_name=kernel_name, **km_kwargs)
        km.client_class = "conftest.ValidatingClient"
        km.client_factory = ValidatingClient
        if env is None:
            km.start_kernel(stderr=stderr)
        else:
            km.start_kernel(stderr=stderr, env=env)
        kc = km.client()
        kc.start_channels(iopub=iopub, stdin=stdin)
        try:
            if iopub:
                wait_ready(km, kc, START_TIMEOUT)
            else:
                _wait_shell_ready(km, kc, START_TIMEOUT)
        except RuntimeError:
            process = getattr(km.provisioner, "process", None)
            port_race = process is not None and process.poll() == EXIT_RUNTIME
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            if port_race and attempt < START_ATTEMPTS:
                continue
            raise
        return km, kc  # type: ignore[return-value]
    raise AssertionError("unreachable")


def stop_kernel(km: KernelManager, kc: BlockingKernelClient) -> None:
    kc.stop_channels()
    if km.is_alive():
        km.shutdown_kernel(now=False)


@pytest.fixture(scope="module")
def kernel(jupyter_path: str) -> Iterator[tuple[KernelManager, ValidatingClient]]:
    km, kc = start_kernel("trikernel-test-signal")
    yield km, kc
    stop_kernel(km, kc)


def collect_outputs(kc: BlockingKernelClient, msg_id: str, timeout: float = TIMEOUT) -> list[dict[str, Any]]:
    """IOPub messages parented to ``msg_id`` up to and including its idle status."""
    out = []
    deadline = time.monotonic() + timeout
    while True:
        msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        out.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return out


def execute(
    kc: BlockingKernelClient, code: str, timeout: float = TIMEOUT, **kw: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Execute ``code``; returns (execute_reply, iopub messages of that request)."""
    msg_id = kc.execute(code, **kw)
    outputs = collect_outputs(kc, msg_id, timeout)
    reply = kc.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=timeout)
    return reply, outputs


def wait_for_marker(kc: BlockingKernelClient, msg_id: str, marker: str = "STARTED", timeout: float = TIMEOUT) -> None:
    """Wait until the cell ``msg_id`` has printed ``marker``: the event that says
    its code is past that print (e.g. about to block)."""
    deadline = time.monotonic() + timeout
    seen = ""
    while marker not in seen:
        m = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream":
            seen += m["content"]["text"]


#: A cell that leaves a SIGINT stuck before a blocking call on purpose: a thread
#: trips SIGINT (``_thread.interrupt_main``: Python's C-level handler's effect,
#: without a signal, so nothing returns EINTR) once the main thread is at the
#: ``time.sleep(600)``, inside it or about to enter it. That is the state a real
#: SIGINT leaves when it lands after CPython's last check for signals and before
#: the sleep begins (user/sigwatch.py): the cell slept its 600 s before the kernel
#: nudged the main thread.
STUCK_SIGINT_CELL = """\
import _thread, sys, threading, time
cell = sys._getframe().f_code.co_filename  # each statement runs in a frame of its own
def trip():
    main = threading.main_thread().ident
    while not ((f := sys._current_frames().get(main)) and f.f_code.co_filename == cell and f.f_lineno == 10):
        time.sleep(0.001)
    _thread.interrupt_main()
threading.Thread(target=trip, daemon=True).start()
print('STARTED', flush=True)
time.sleep(600)
"""
assert STUCK_SIGINT_CELL.splitlines()[9] == "time.sleep(600)"


def stdout_of(outputs: list[dict[str, Any]], name: str = "stdout") -> str:
    return "".join(m["content"]["text"] for m in outputs if m["msg_type"] == "stream" and m["content"]["name"] == name)


def message_log_lines(path: str) -> list[dict[str, Any]]:
    """The whole lines of a ``--message-log`` file, as dicts, oldest first.

    The kernel's writer thread may be mid-write while a test reads: a last
    line without its newline is still being written and is left out (read
    again for it), never parsed half-way.
    """
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def which(cmd: str) -> str:
    path = shutil.which(cmd, path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    assert path, f"{cmd} not found"
    return path
