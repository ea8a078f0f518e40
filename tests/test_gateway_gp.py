"""trikernel under gateway_provisioners (tier 3/4): real GP servers, real kernels.

- GP's ``ResponseManager`` receives and decrypts the payload of a real
  ``gateway-launch`` process over TCP; the comm port then signals or shuts
  the process down.
- GP's ``DistributedProvisioner`` with ``remote_hosts: ["localhost"]`` (GP
  launches a local host without SSH) on jupyter_client 8's
  ``AsyncKernelManager``: start, execute, interrupt, restart, shut down, with
  no process or port left behind; CurveZMQ with
  ``transport_encryption="required"``; 20 kernels at once.
- The same kernelspec through jupyter_server's REST and websocket API.
- The container path up to the container runtime: GP's
  ``KubernetesProvisioner.pre_launch`` and its ``launch_kubernetes.py``
  (``--pod-template``: the pod it would create) with our kernelspec, then the
  pod's environment run through ``containers/bootstrap-kernel.sh``.

Loopback only: GP's response socket binds 127.0.0.1 (``GP_RESPONSE_IP``),
the kernels bind 127.0.0.1 (``--ip``). The SSH path into a second network
namespace is in test_gateway_ssh.py.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# gateway_provisioners reads these when its modules are imported.
os.environ.setdefault("GP_RESPONSE_IP", "127.0.0.1")
if "GP_KERNEL_LOG_DIR" not in os.environ:  # GP's per-kernel logs (failing tests print them)
    os.environ["GP_KERNEL_LOG_DIR"] = tempfile.mkdtemp(prefix="trikernel-gp-logs-")
    atexit.register(shutil.rmtree, os.environ["GP_KERNEL_LOG_DIR"], ignore_errors=True)

import asyncio
import contextlib
import json
import logging
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest
import zmq
import zmq.utils.monitor
from conftest import TIMEOUT, ValidatingClient, install_kernelspec, wait_for_marker
from jupyter_client import AsyncKernelManager
from jupyter_client.blocking.client import BlockingKernelClient

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from jupyter_client.asynchronous.client import AsyncKernelClient

ResponseManager = pytest.importorskip(
    "gateway_provisioners.response_manager", reason="gateway_provisioners is not installed"
).ResponseManager

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[1]
BOOTSTRAP = REPO / "containers" / "bootstrap-kernel.sh"
#: GP refuses KERNEL_USERNAME "root" by default (GP_UNAUTHORIZED_USERS); tests run as root here.
KERNEL_USERNAME = "trikernel-test"
#: A 1000-port range (GP's minimum) below Linux's ephemeral ports, for the crowd.
CROWD_RANGE = (21000, 22000)


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gp_specs(tmp_path_factory: pytest.TempPathFactory) -> str:
    """JUPYTER_PATH entry with trikernel's distributed kernelspecs, installed with the CLI."""
    prefix = tmp_path_factory.mktemp("gp-specs")
    common = ("--gateway", "distributed", "--remote-hosts", "localhost", "--ip", "127.0.0.1", "--launch-timeout", "120")
    jp = install_kernelspec(prefix, "tk-gp", *common)
    install_kernelspec(prefix, "tk-gp-range", *common, "--port-range", "{}..{}".format(*CROWD_RANGE))
    return jp


@pytest.fixture
def gp_env(gp_specs: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("JUPYTER_PATH", gp_specs)
    monkeypatch.setenv("KERNEL_USERNAME", KERNEL_USERNAME)
    return gp_specs


@contextlib.asynccontextmanager
async def response_manager() -> AsyncIterator[ResponseManager]:
    """GP's ResponseManager singleton for this event loop; cleared afterwards, since
    it polls its socket from a callback bound to the loop it was created in."""
    rm = ResponseManager.instance()
    try:
        yield rm
    finally:
        rm.stop_response_manager()
        ResponseManager.clear_instance()


def check(msg: dict[str, Any]) -> dict[str, Any]:
    """Schema-check one message as conftest.ValidatingClient does."""
    return ValidatingClient._check(None, msg)  # type: ignore[arg-type]


async def run_cell(kc: AsyncKernelClient, code: str, within: float = TIMEOUT) -> tuple[dict[str, Any], str]:
    """Execute ``code``; (execute_reply, stdout). Every message read is schema-checked."""
    msg_id = kc.execute(code)
    out = ""
    deadline = time.monotonic() + within
    while True:
        m = check(await kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic())))
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        if m["msg_type"] == "stream" and m["content"]["name"] == "stdout":
            out += m["content"]["text"]
        if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            break
    while True:
        reply = check(await kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic())))
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply, out


async def wait_stdout(kc: AsyncKernelClient, msg_id: str, marker: str) -> None:
    seen = ""
    while marker not in seen:
        m = check(await kc.get_iopub_msg(timeout=TIMEOUT))
        if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream":
            seen += m["content"]["text"]


def refused(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def listening_ports(pid: int) -> set[int]:
    return {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kernel_ports(km: AsyncKernelManager) -> list[int]:
    ports = [km.shell_port, km.iopub_port, km.stdin_port, km.control_port, km.hb_port, km.provisioner.comm_port]
    assert all(isinstance(p, int) and p > 0 for p in ports), ports
    return ports


def kernel_log(km: AsyncKernelManager) -> str:
    path = getattr(km.provisioner, "kernel_log", None)
    with contextlib.suppress(OSError, TypeError):
        return Path(path).read_text()[-3000:]  # type: ignore[arg-type]
    return ""


async def start(name: str, **kw: Any) -> tuple[AsyncKernelManager, AsyncKernelClient]:
    km = AsyncKernelManager(kernel_name=name, **kw)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=TIMEOUT)
    except RuntimeError:
        kc.stop_channels()
        log = kernel_log(km)
        await km.shutdown_kernel(now=True)
        raise AssertionError(f"kernel did not become ready; its log:\n{log}") from None
    return km, kc


# ---------------------------------------------------------------------------
# GP's ResponseManager and a real gateway-launch process
# ---------------------------------------------------------------------------


def launch_cmd(rm: ResponseManager, kernel_id: str, *extra: str, public_key: str | None = None) -> list[str]:
    return [
        sys.executable, "-m", "trikernel", "gateway-launch", "--kernel-id", kernel_id,
        "--response-address", rm.response_address, "--public-key", public_key or rm.public_key,
        "--port-range", "0..0", "--ip", "127.0.0.1", *extra,
    ]  # fmt: skip


async def wait_payload(rm: ResponseManager, kernel_id: str, within: float = TIMEOUT) -> dict[str, Any]:
    await asyncio.wait_for(rm._response_registry[kernel_id].wait(), within)
    info: dict[str, Any] = rm._response_registry.pop(kernel_id).response
    return info


def spawn(cmd: list[str], **kw: Any) -> subprocess.Popen[bytes]:
    """Popen (returns at once; the tests wait for the process through asyncio.to_thread)."""
    return subprocess.Popen(cmd, **kw)


def send_comm(port: int, request: dict[str, Any]) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:  # as GP's _send_listener_request
        s.sendall(json.dumps(request).encode())
        s.shutdown(socket.SHUT_WR)


def lasting_children(pid: int) -> list[psutil.Process]:
    """The children of ``pid`` still running 10 s on. GP's own launcher forks a
    listener that lives as long as the kernel; a transient child may be trio's
    import running ``ldconfig -p`` once (trio/_core/_thread_cache.py)."""
    _gone, alive = psutil.wait_procs(psutil.Process(pid).children(recursive=True), timeout=10)
    return alive


def test_gp_response_manager_decrypts_a_real_launch_and_the_ports_are_held(tmp_path: Path) -> None:
    async def main() -> None:
        async with response_manager() as rm:
            kid = str(uuid.uuid4())
            rm.register_event(kid)
            err = open(tmp_path / "kernel.log", "w")  # noqa: ASYNC230, SIM115 - closed below
            proc = spawn(launch_cmd(rm, kid, "--transport-encryption", "required"), stderr=err)
            try:
                info = await wait_payload(rm, kid)
                assert info["kernel_id"] == kid
                assert info["pid"] == proc.pid
                assert info["pgid"] == os.getpgid(proc.pid)
                assert (info["ip"], info["transport"], info["signature_scheme"]) == ("127.0.0.1", "tcp", "hmac-sha256")
                assert isinstance(info["key"], bytes)  # GP hands the key on as bytes
                assert len(info["key"]) >= 32
                assert len(info["curve_publickey"]) == 40
                assert len(info["curve_secretkey"]) == 40
                ports = {info[k] for k in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")}
                ports.add(info["comm_port"])
                assert len(ports) == 6
                # every reported port is held by the kernel process itself already (no child, no re-bind)
                assert ports <= listening_ports(proc.pid)
                assert await asyncio.to_thread(lasting_children, proc.pid) == []  # no forked listener
                send_comm(info["comm_port"], {"shutdown": 1})  # an orderly shutdown
                assert await asyncio.to_thread(proc.wait, 30) == 0
                assert all(refused(p) for p in ports)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                err.close()

    asyncio.run(main())


def test_shutdown_while_ipython_loads_does_not_wait_out_the_grace() -> None:
    """Regression: a shutdown that came before the user run had started waited
    for --shutdown-grace (the stop could not be queued yet)."""

    async def main() -> None:
        async with response_manager() as rm:
            kid = str(uuid.uuid4())
            rm.register_event(kid)
            # a grace far longer than the wait below: exiting at all shows it was not waited out
            proc = spawn(launch_cmd(rm, kid, "--shutdown-grace", "600"), stderr=subprocess.DEVNULL)
            try:
                info = await wait_payload(rm, kid)
                send_comm(info["comm_port"], {"shutdown": 1})  # sent before IPython has loaded
                assert await asyncio.to_thread(proc.wait, 120) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    asyncio.run(main())


def test_interrupt_works_when_the_launcher_left_sigint_ignored() -> None:
    """Regression: over SSH GP starts the kernel as `nohup ... &`, and a non-interactive
    shell starts background jobs with SIGINT ignored; interrupts must still work."""

    async def main() -> None:
        async with response_manager() as rm:
            kid = str(uuid.uuid4())
            rm.register_event(kid)
            proc = spawn(
                launch_cmd(rm, kid),
                stderr=subprocess.DEVNULL,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
            )
            kc = BlockingKernelClient()
            try:
                info = await wait_payload(rm, kid)
                kc.load_connection_info(info)
                kc.start_channels()
                await asyncio.to_thread(kc.wait_for_ready, timeout=TIMEOUT)
                msg_id = kc.execute("import time\nprint('STARTED', flush=True)\ntime.sleep(60)")
                await asyncio.to_thread(wait_for_marker, kc, msg_id)
                send_comm(info["comm_port"], {"signum": 2})
                while True:
                    reply = check(await asyncio.to_thread(kc.get_shell_msg, timeout=TIMEOUT))
                    if reply["parent_header"].get("msg_id") == msg_id:
                        break
                assert reply["content"]["ename"] == "KeyboardInterrupt"
            finally:
                kc.stop_channels()
                proc.kill()
                proc.wait()

    asyncio.run(main())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_comm_port_signal_15_and_9_reach_the_kernel_process(signum: int) -> None:
    async def main() -> None:
        async with response_manager() as rm:
            kid = str(uuid.uuid4())
            rm.register_event(kid)
            proc = spawn(launch_cmd(rm, kid), stderr=subprocess.DEVNULL)
            try:
                info = await wait_payload(rm, kid)
                send_comm(info["comm_port"], {"signum": 0})  # liveness: nothing happens
                send_comm(info["comm_port"], {"signum": int(signum)})
                assert await asyncio.to_thread(proc.wait, 30) == -signum
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    asyncio.run(main())


class _Records(logging.Handler):
    def __init__(self, loop: asyncio.AbstractEventLoop, pattern: str) -> None:
        super().__init__()
        self.loop, self.pattern, self.hit = loop, pattern, asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.pattern in record.getMessage():
            self.loop.call_soon_threadsafe(self.hit.set)


def test_gp_refuses_a_payload_for_another_server_key() -> None:
    from test_gateway import GPServerKeys

    async def main() -> None:
        async with response_manager() as rm:
            records = _Records(asyncio.get_running_loop(), "Failure occurred processing connection")
            rm.log.addHandler(records)
            kid = str(uuid.uuid4())
            rm.register_event(kid)
            proc = spawn(launch_cmd(rm, kid, public_key=GPServerKeys().public_key), stderr=subprocess.PIPE)
            try:
                await asyncio.wait_for(records.hit.wait(), TIMEOUT)  # GP could not decrypt it and said so
                assert not rm._response_registry[kid].is_set()
            finally:
                rm.log.removeHandler(records)
                proc.kill()
                proc.wait()

    asyncio.run(main())


def test_unreachable_response_address_exits_1_with_one_line_and_holds_nothing() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    from test_gateway import GPServerKeys

    r = subprocess.run(
        [sys.executable, "-m", "trikernel", "gateway-launch", "--kernel-id", "k", "--response-address",
         f"127.0.0.1:{port}", "--public-key", GPServerKeys().public_key, "--ip", "127.0.0.1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 1
    assert (
        r.stderr.strip().splitlines()[-1].startswith(f"trikernel: start-up failed: response address 127.0.0.1:{port}: ")
    )


# ---------------------------------------------------------------------------
# GP's DistributedProvisioner (remote_hosts ["localhost"]) on AsyncKernelManager
# ---------------------------------------------------------------------------


def test_distributed_provisioner_lifecycle(gp_env: str) -> None:
    async def main() -> None:
        async with response_manager():
            km, kc = await start("tk-gp")
            try:
                prov = km.provisioner
                assert type(prov).__name__ == "DistributedProvisioner"
                assert prov.assigned_host == "localhost"
                pid = prov.pid
                assert pid == prov.local_proc.pid  # the kernel itself: GP launched it without SSH
                assert "gateway-launch" in psutil.Process(pid).cmdline()
                assert await asyncio.to_thread(lasting_children, pid) == []  # no forked listener
                ports = kernel_ports(km)
                assert set(ports) <= listening_ports(pid)

                reply, out = await run_cell(kc, "import os\nprint(os.getpid(), 6 * 7)")
                assert reply["content"]["status"] == "ok"
                assert out == f"{pid} 42\n"

                # interrupt through the comm port ({"signum": 2})
                msg_id = kc.execute("import time\nprint('STARTED', flush=True)\ntime.sleep(60)")
                await wait_stdout(kc, msg_id, "STARTED")
                t0 = time.monotonic()
                await km.interrupt_kernel()
                while True:
                    reply = check(await kc.get_shell_msg(timeout=TIMEOUT))
                    if reply["parent_header"].get("msg_id") == msg_id:
                        break
                interrupted_in = time.monotonic() - t0
                assert reply["content"]["status"] == "error"
                assert reply["content"]["ename"] == "KeyboardInterrupt"
                assert interrupted_in < 1.0, interrupted_in
                reply, out = await run_cell(kc, "print('still here')")
                assert out == "still here\n"

                # restart: a new process with new ports; the old one is gone with all its ports
                kc.stop_channels()
                await km.restart_kernel()
                assert gone(pid)
                assert all(refused(p) for p in ports)
                kc = km.client()
                kc.start_channels()
                await kc.wait_for_ready(timeout=TIMEOUT)
                pid2 = km.provisioner.pid
                assert pid2 != pid
                ports = kernel_ports(km)
                reply, out = await run_cell(kc, "import os\nprint(os.getpid())")
                assert out == f"{pid2}\n"

                kc.stop_channels()
                t0 = time.monotonic()
                await km.shutdown_kernel()
                shutdown_in = time.monotonic() - t0
                assert shutdown_in < 2.0, shutdown_in
                assert gone(pid2)
                assert all(refused(p) for p in ports)
                assert not await km.is_alive()
            except BaseException:
                print(kernel_log(km))
                raise
            finally:
                kc.stop_channels()
                if km.has_kernel:
                    await km.shutdown_kernel(now=True)

    asyncio.run(main())


def test_shutdown_now_leaves_no_listener(gp_env: str) -> None:
    """The stock launcher leaves its forked listener running after shutdown_kernel(now=True)."""

    async def main() -> None:
        async with response_manager():
            km, kc = await start("tk-gp")
            pid, ports = km.provisioner.pid, kernel_ports(km)
            kc.stop_channels()
            await km.shutdown_kernel(now=True)
            assert gone(pid)
            assert all(refused(p) for p in ports)

    asyncio.run(main())


def _handshake_events(port: int, *, curve_server_key: bytes | None) -> str:
    """Connect a DEALER (CURVE client if a server key is given) and return the first
    handshake event libzmq reports for it."""
    ctx = zmq.Context()
    try:
        s = ctx.socket(zmq.DEALER)
        s.linger = 0
        if curve_server_key is not None:
            pub, sec = zmq.curve_keypair()
            s.curve_serverkey, s.curve_publickey, s.curve_secretkey = curve_server_key, pub, sec
        mon = s.get_monitor_socket()
        s.connect(f"tcp://127.0.0.1:{port}")
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if mon.poll(int((deadline - time.monotonic()) * 1000)):
                name = zmq.Event(zmq.utils.monitor.recv_monitor_message(mon)["event"]).name
                if name.startswith("HANDSHAKE"):
                    return name
        return "no handshake event"
    finally:
        ctx.destroy(0)


def test_transport_encryption_required_encrypts_the_channels(gp_env: str) -> None:
    async def main() -> None:
        async with response_manager():
            km, kc = await start("tk-gp", transport_encryption="required")
            try:
                assert km.curve_publickey is not None  # from the launcher's payload
                _, out = await run_cell(kc, "print('over CURVE')")
                assert out == "over CURVE\n"
                for port in (km.shell_port, km.control_port, km.iopub_port):
                    # a plaintext peer is refused (libzmq reports PROTOCOL or NO_DETAIL, whichever side notices first)
                    assert _handshake_events(port, curve_server_key=None).startswith("HANDSHAKE_FAILED_")
                assert _handshake_events(km.shell_port, curve_server_key=km.curve_publickey) == "HANDSHAKE_SUCCEEDED"
                assert "not encrypted" not in kernel_log(km)
            finally:
                kc.stop_channels()
                await km.shutdown_kernel()

    asyncio.run(main())


CROWD = 20


def test_crowd_of_20_through_gp_all_ready(gp_env: str) -> None:
    """20 kernels at once, all in one 1000-port range: every one binds what it reports."""

    async def one(i: int) -> tuple[int, list[int]]:
        km, kc = await start("tk-gp-range")
        try:
            _, out = await run_cell(kc, f"print({i} * 2)")
            assert out == f"{i * 2}\n"
            ports = kernel_ports(km)
            return km.provisioner.pid, ports
        finally:
            kc.stop_channels()
            await km.shutdown_kernel()

    async def main() -> list[tuple[int, list[int]]]:
        async with response_manager():
            return await asyncio.gather(*(one(i) for i in range(CROWD)))

    results = asyncio.run(main())
    assert len(results) == CROWD
    all_ports = [p for _, ports in results for p in ports]
    assert all(CROWD_RANGE[0] <= p <= CROWD_RANGE[1] for p in all_ports)
    assert all(gone(pid) for pid, _ in results)


# ---------------------------------------------------------------------------
# jupyter_server: REST and websocket, as JupyterLab drives a kernel
# ---------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path, gp_specs: str) -> Iterator[tuple[str, str]]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    token = uuid.uuid4().hex
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"),
               JUPYTER_PATH=gp_specs, KERNEL_USERNAME=KERNEL_USERNAME, GP_RESPONSE_IP="127.0.0.1")  # fmt: skip
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - closed below
    p = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", f"--ServerApp.port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={token}", "--ServerApp.open_browser=False", f"--ServerApp.root_dir={tmp_path}",
         "--allow-root"],
        stdout=log, stderr=log, env=env,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline or p.poll() is not None:
                p.kill()
                log.close()
                pytest.fail("jupyter_server did not start:\n" + (tmp_path / "server.log").read_text()[-3000:])
            time.sleep(0.2)  # polling a server that has no readiness event
    try:
        yield base, token
    finally:
        p.terminate()
        p.wait(timeout=30)
        log.close()
        # shown by pytest only when the test failed: the server's side of it (and the kernel's
        # stderr, which GP's launcher hands to the server's)
        print("jupyter_server log, the end:\n" + (tmp_path / "server.log").read_text(errors="replace")[-6000:])


def _rest(base: str, token: str, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
    req = urllib.request.Request(
        f"{base}{path}?token={token}",
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        data = r.read()
    return json.loads(data) if data else None


class _WS:
    def __init__(self, base: str, token: str, kernel_id: str) -> None:
        import websocket  # websocket-client, a jupyter_server dependency

        self.session = uuid.uuid4().hex
        self.ws = websocket.create_connection(
            f"{base.replace('http', 'ws')}/api/kernels/{kernel_id}/channels?token={token}", timeout=TIMEOUT
        )

    def execute(self, code: str) -> str:
        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "t", "session": self.session,
                       "date": "2026-01-01T00:00:00Z", "version": "5.5"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True},
        }))  # fmt: skip
        return msg_id

    def recv(self, deadline: float) -> dict[str, Any]:
        """The next message, by ``deadline`` (monotonic seconds), else ``{}``.
        The socket's timeout is what is left: jupyter_server pings every 30 s
        and a ping restarts a fixed timeout, so without this a test waiting on
        a message that never comes would hang until pytest-timeout."""
        import websocket

        self.ws.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            return json.loads(self.ws.recv())  # type: ignore[no-any-return]
        except websocket.WebSocketTimeoutException:
            return {}

    def run(self, code: str, *, until_stdout: str | None = None) -> dict[str, Any]:
        """Messages of one request: stdout text and the reply content (or stop at
        ``until_stdout``), once both the reply and the idle came. jupyter_server
        relays shell and IOPub from two sockets, so the idle may come first
        over the websocket although the kernel sent the reply before it (seen
        under load: the idle was skipped, and the test waited for it in vain)."""
        msg_id = self.execute(code)
        seen: dict[str, Any] = {"stdout": "", "others": []}
        idle = False
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            m = self.recv(deadline)
            if m.get("parent_header", {}).get("msg_id") != msg_id:
                if m:  # what else came (a restart's status, a nudge's reply), for the failure message
                    seen["others"].append((m.get("channel"), m["msg_type"], m["content"].get("execution_state")))
                continue
            if m["msg_type"] == "stream":
                seen["stdout"] += m["content"]["text"]
                if until_stdout and until_stdout in seen["stdout"]:
                    seen["msg_id"] = msg_id
                    return seen
            elif m["msg_type"] == "execute_reply":
                seen["reply"] = m["content"]
            elif m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                idle = True
            if idle and "reply" in seen:
                return seen
        raise AssertionError(f"no reply and idle within {TIMEOUT} s (idle: {idle}): {seen}")

    def reply_of(self, msg_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            m = self.recv(deadline)
            if m.get("msg_type") == "execute_reply" and m["parent_header"].get("msg_id") == msg_id:
                return m["content"]  # type: ignore[no-any-return]
        raise AssertionError("no execute_reply")

    def close(self) -> None:
        self.ws.close()


def test_jupyter_server_rest_and_websocket(server: tuple[str, str]) -> None:
    base, token = server
    kernel = _rest(base, token, "/api/kernels", "POST", {"name": "tk-gp"})
    kid = kernel["id"]
    ws = _WS(base, token, kid)
    try:
        first = ws.run("import os\nprint(os.getpid(), 6 * 7)")
        assert first["reply"]["status"] == "ok"
        pid = int(first["stdout"].split()[0])
        assert first["stdout"].split()[1] == "42"

        started = ws.run("import time\nprint('STARTED', flush=True)\ntime.sleep(60)", until_stdout="STARTED")
        _rest(base, token, f"/api/kernels/{kid}/interrupt", "POST", {})
        reply = ws.reply_of(started["msg_id"])
        assert reply["ename"] == "KeyboardInterrupt"  # the 60 s sleep was cut short

        _rest(base, token, f"/api/kernels/{kid}/restart", "POST", {})
        assert gone(pid)
        ws.close()
        ws = _WS(base, token, kid)  # the channels of the restarted kernel
        second = ws.run("import os\nprint(os.getpid())")
        pid2 = int(second["stdout"])
        assert pid2 != pid
    finally:
        ws.close()
        t0 = time.monotonic()
        _rest(base, token, f"/api/kernels/{kid}", "DELETE")
        shutdown_in = time.monotonic() - t0
    assert shutdown_in < 2.0, shutdown_in
    assert gone(pid2)
    assert kid not in {k["id"] for k in _rest(base, token, "/api/kernels")}


# ---------------------------------------------------------------------------
# Kubernetes and Docker: everything up to the container runtime
# ---------------------------------------------------------------------------

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: none, user: {token: unused}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


def test_kubernetes_chain_up_to_the_container_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GP's KubernetesProvisioner.pre_launch with our kernelspec -> GP's launch_kubernetes.py
    (--pod-template: the pod it would create, no API call) -> the pod's image and
    environment -> containers/bootstrap-kernel.sh -> our kernel -> GP's ResponseManager
    -> a client runs a cell -> GP's shutdown_listener stops the kernel."""
    pytest.importorskip("kubernetes", reason="GP's Kubernetes provisioner needs the 'kubernetes' package")
    yaml = pytest.importorskip("yaml")
    image = "trikernel/kernel-py:test"
    jp = install_kernelspec(tmp_path / "k8s", "tk-k8s", "--gateway", "kubernetes", "--image-name", image)
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    monkeypatch.setenv("JUPYTER_PATH", jp)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.setenv("KERNEL_USERNAME", KERNEL_USERNAME)
    pod_file = tmp_path / "pod.yaml"

    async def main() -> None:
        async with response_manager() as rm:
            km = AsyncKernelManager(kernel_name="tk-k8s", transport_encryption="required")
            # GP's own substitution and environment (what launch_kernel would run)
            cmd, kw = await km._async_pre_start_kernel()
            assert type(km.provisioner).__name__ == "KubernetesProvisioner"
            env = {**kw["env"], "JPY_PARENT_PID": str(os.getpid())}  # as jupyter_client's launch_kernel adds it
            r = await asyncio.to_thread(
                subprocess.run, [*cmd, "--pod-template", str(pod_file)], env=env, capture_output=True, text=True,
                timeout=120,
            )  # fmt: skip
            assert r.returncode == 0, r.stderr[-3000:]
            pod = yaml.safe_load(pod_file.read_text())
            container = pod["spec"]["containers"][0]
            assert container["image"] == image
            pod_env = {e["name"]: str(e["value"]) for e in container["env"]}
            assert pod_env["KERNEL_ID"] == km.kernel_id
            assert pod_env["RESPONSE_ADDRESS"] == rm.response_address
            assert pod_env["PUBLIC_KEY"] == rm.public_key
            assert pod_env["PORT_RANGE"] == "0..0"
            assert pod_env["TRANSPORT_ENCRYPTION"] == "required"
            assert pod_env["JPY_PARENT_PID"] == str(os.getpid())  # copied in: the bootstrap must drop it

            # the container's CMD, with the pod's environment (and this machine's PATH and interpreter)
            boot_env = {**pod_env, "PATH": os.environ["PATH"], "TRIKERNEL_PYTHON": sys.executable}
            log = open(tmp_path / "kernel.log", "w")  # noqa: ASYNC230, SIM115 - closed below
            proc = spawn(["/bin/sh", str(BOOTSTRAP), "--ip", "127.0.0.1"], env=boot_env, stderr=log)
            try:
                info = await wait_payload(rm, km.kernel_id)
                assert info["pid"] == proc.pid  # the bootstrap exec'd the kernel: no shell left behind
                kc = BlockingKernelClient()
                kc.load_connection_info({**info, "ip": "127.0.0.1"})
                kc.start_channels()
                try:
                    await asyncio.to_thread(kc.wait_for_ready, timeout=TIMEOUT)
                    msg = await asyncio.to_thread(kc.execute_interactive, "print('in the pod')", timeout=TIMEOUT)
                    assert msg["content"]["status"] == "ok"
                finally:
                    kc.stop_channels()
                km.provisioner.comm_ip, km.provisioner.comm_port = "127.0.0.1", info["comm_port"]
                await km.provisioner.shutdown_listener(restart=False)  # what GP sends on shutdown
                assert await asyncio.to_thread(proc.wait, 30) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                log.close()

    asyncio.run(main())
