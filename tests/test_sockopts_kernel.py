"""Kernel-level socket option tests: ``python -m trikernel`` as a subprocess.

- Rejections: every path (syntax, channel, unknown/reserved option, wrong
  socket type, bad value, environment variable, config file) exits with
  code 2, prints the one-line ConfigError on stderr, and starts nothing (the
  connection file is not rewritten, no socket was configured).
- Read-back: with ``--log-level DEBUG`` the kernel logs one line per channel,
  "effective socket options for <channel>: NAME=VALUE ...", and the values
  given on the CLI, in TRIKERNEL_SOCKET_OPTIONS and in ``--config`` are there.
- IOPub HWM: a stalled subscriber that connects after start-up gets at most
  about SNDHWM + client-side buffering of a burst (NODROP off), and all of it
  with a large SNDHWM.
- Kernelspec: ``python -m trikernel install --socket-option ...`` bakes the
  options into argv and a kernel started from it through jupyter_client has
  them.

All of these wait on the kernel core (``trikernel.__main__``) and are skipped
until it exists. Loopback only; every test has a timeout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import zmq
from conftest import wait_ready

from trikernel.errors import ConfigError
from trikernel.server.sockopts import CHANNELS, ENV_VAR, resolve

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("trikernel.__main__") is None,
    reason="waits on the kernel core: python -m trikernel",
)

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT = 60.0  # seconds for the kernel to bind and log (IPython import included)
EFFECTIVE = "effective socket options for "


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


def write_connection_file(tmp_path: Path) -> Path:
    """Zero ports: the kernel binds random ports and writes them back (mode B)."""
    path = tmp_path / "kernel-conn.json"
    info = {
        "shell_port": 0,
        "iopub_port": 0,
        "stdin_port": 0,
        "control_port": 0,
        "hb_port": 0,
        "ip": "127.0.0.1",
        "transport": "tcp",
        "key": secrets.token_hex(16),
        "signature_scheme": "hmac-sha256",
        "kernel_name": "trikernel",
    }
    path.write_text(json.dumps(info), encoding="utf-8")
    return path


def kernel_cmd(conn: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "trikernel", "-f", str(conn), *args]


def expected_message(cli: Sequence[str], environ: dict[str, str], config: str | None) -> str:
    """The exact ConfigError line sockopts.resolve gives for these inputs."""
    with pytest.raises(ConfigError) as exc:
        resolve(list(cli), environ, config)
    return str(exc.value)


# --------------------------------------------------------------------------- rejections

REJECTIONS: list[tuple[str, list[str], str | None, str | None]] = [
    # (id, CLI specs, env value, config TOML text)
    ("syntax", ["SNDHWM=1"], None, None),
    ("unknown-channel", ["shel.SNDHWM=1"], None, None),
    ("unknown-option", ["iopub.SNDHMW=5"], None, None),
    ("wrong-socket-type", ["shell.XPUB_NODROP=1"], None, None),
    ("wildcard-wrong-type", ["*.ROUTER_HANDOVER=0"], None, None),
    ("never", ["iopub.SUBSCRIBE=x"], None, None),
    ("reserved-curve", ["shell.CURVE_SERVER=1"], None, None),
    ("not-configurable", ["shell.ROUTING_ID=abc"], None, None),
    ("connect-only", ["shell.RECONNECT_IVL=5"], None, None),
    ("bad-value", ["iopub.SNDHWM=-5"], None, None),
    ("bad-bool", ["iopub.XPUB_NODROP=2"], None, None),
    ("fixed-verbose", ["iopub.XPUB_VERBOSE=0"], None, None),
    ("partial-set", ["iopub.SNDHWM=100", "shell.LINGER=0", "hb.TOS=999"], None, None),
    ("env-bad", [], "iopub.SNDHWM=1;shell.XPUB_NODROP=1", None),
    ("env-bad-under-good-cli", ["iopub.SNDHWM=1"], "iopub.SNDHWM=-1", None),
    ("config-bad-value", [], None, '[socket_options]\n"iopub.SNDHWM" = -3\n'),
    ("config-bad-key", [], None, "[socket_options]\nSNDHWM = 5\n"),
    ("config-bad-toml", [], None, "[socket_options\n"),
    ("config-wrong-type", [], None, '[socket_options]\n"iopub.SNDHWM" = 1.5\n'),
]


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("cli", "env", "config"), [r[1:] for r in REJECTIONS], ids=[r[0] for r in REJECTIONS])
def test_rejection_exits_2_with_message(tmp_path: Path, cli: list[str], env: str | None, config: str | None) -> None:
    conn = write_connection_file(tmp_path)
    before = conn.read_text(encoding="utf-8")
    args: list[str] = []
    for spec in cli:
        args += ["--socket-option", spec]
    config_path = None
    if config is not None:
        config_path = str(tmp_path / "trikernel.toml")
        Path(config_path).write_text(config, encoding="utf-8")
        args += ["--config", config_path]
    environ = {ENV_VAR: env} if env is not None else {}
    message = expected_message(cli, environ, config_path)

    proc = subprocess.run(
        kernel_cmd(conn, *args, "--log-level", "DEBUG"),
        env=_env(environ),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr, (message, proc.stderr)
    # Nothing started: no socket was configured, no ports were written back.
    assert EFFECTIVE not in proc.stderr
    assert conn.read_text(encoding="utf-8") == before


@pytest.mark.timeout(90)
def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    conn = write_connection_file(tmp_path)
    missing = str(tmp_path / "nope.toml")
    message = expected_message([], {}, missing)
    proc = subprocess.run(
        kernel_cmd(conn, "--config", missing),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr


# --------------------------------------------------------------------------- running kernel


class RunningKernel:
    """A kernel subprocess whose stderr lines are collected by a thread."""

    def __init__(self, cmd: list[str], env: dict[str, str], conn: Path) -> None:
        self.conn = conn
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line.rstrip("\n"))

    def effective_lines(self, timeout: float = START_TIMEOUT) -> dict[str, dict[str, str]]:
        """Wait for the five debug lines; return {channel: {NAME: VALUE}}."""
        found: dict[str, dict[str, str]] = {}
        deadline = time.monotonic() + timeout
        while len(found) < len(CHANNELS):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (self.proc.poll() is not None and self.lines.empty()):
                raise AssertionError(f"missing effective-options lines; stderr so far:\n{self.stderr()}")
            try:
                line = self.lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            self.seen.append(line)
            if EFFECTIVE in line:
                channel, _, rest = line.split(EFFECTIVE, 1)[1].partition(": ")
                found[channel] = dict(item.split("=", 1) for item in rest.split())
        return found

    def connection_info(self, timeout: float = START_TIMEOUT) -> dict[str, object]:
        """Wait until the kernel wrote real ports back into the connection file."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                info = json.loads(self.conn.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                info = {}
            if info.get("iopub_port") and info.get("shell_port"):
                return dict(info)
            assert self.proc.poll() is None, self.stderr()
            time.sleep(0.05)
        raise AssertionError(f"ports never written; stderr:\n{self.stderr()}")

    def stderr(self) -> str:
        while not self.lines.empty():
            self.seen.append(self.lines.get_nowait())
        return "\n".join(self.seen)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def start_kernel(tmp_path: Path) -> Iterator[object]:
    started: list[RunningKernel] = []

    def start(*args: str, environ: dict[str, str] | None = None) -> RunningKernel:
        conn = write_connection_file(tmp_path)
        k = RunningKernel(kernel_cmd(conn, *args, "--log-level", "DEBUG"), _env(environ), conn)
        started.append(k)
        return k

    yield start
    for k in started:
        k.stop()


@pytest.mark.timeout(120)
def test_cli_options_in_effect_per_channel(start_kernel) -> None:  # type: ignore[no-untyped-def]
    args = [
        "--socket-option", "iopub.SNDHWM=12345",
        "--socket-option", "*.TCP_KEEPALIVE=1",
        "--socket-option", "shell.LINGER=0",
        "--socket-option", "control.RCVHWM=77",
        "--socket-option", "stdin.SNDTIMEO=4000",
        "--socket-option", "hb.TOS=16",
        "--socket-option", "iopub.xpub_nodrop=0",
    ]  # fmt: skip
    k = start_kernel(*args)
    eff = k.effective_lines()
    assert set(eff) == set(CHANNELS)
    assert eff["iopub"]["SNDHWM"] == "12345"
    assert eff["iopub"]["XPUB_NODROP"] == "0"
    assert eff["iopub"]["XPUB_VERBOSE"] == "1"
    assert eff["shell"]["LINGER"] == "0"
    assert eff["control"]["RCVHWM"] == "77"
    assert eff["stdin"]["SNDTIMEO"] == "4000"
    assert eff["hb"]["TOS"] == "16"
    for chan in CHANNELS:
        assert eff[chan]["TCP_KEEPALIVE"] == "1"
        if chan != "shell":
            assert eff[chan]["LINGER"] == "1000"
        if chan != "iopub":
            assert eff[chan]["ROUTER_HANDOVER"] == "0"
        if chan != "hb":
            assert (eff[chan]["HEARTBEAT_IVL"], eff[chan]["HEARTBEAT_TIMEOUT"]) == ("10000", "60000")
    k.connection_info()  # it really bound and reported


@pytest.mark.timeout(120)
def test_env_and_config_sources_and_precedence(start_kernel, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "trikernel.toml"
    config.write_text(
        '[socket_options]\n"iopub.SNDHWM" = 111\n"iopub.RCVHWM" = 222\n"*.TOS" = 8\n',
        encoding="utf-8",
    )
    k = start_kernel(
        "--config", str(config), "--socket-option", "iopub.SNDHWM=333",
        environ={ENV_VAR: "iopub.RCVHWM=444; shell.LINGER=5"},
    )  # fmt: skip
    eff = k.effective_lines()
    assert eff["iopub"]["SNDHWM"] == "333"  # CLI beats env and file
    assert eff["iopub"]["RCVHWM"] == "444"  # env beats file
    assert eff["shell"]["LINGER"] == "5"  # env beats default
    assert {eff[c]["TOS"] for c in CHANNELS} == {"8"}  # file beats default


@pytest.mark.timeout(120)
def test_defaults_logged_without_options(start_kernel) -> None:  # type: ignore[no-untyped-def]
    eff = start_kernel().effective_lines()
    pings = {"HEARTBEAT_IVL": "10000", "HEARTBEAT_TIMEOUT": "60000"}
    assert eff["iopub"] == {
        "LINGER": "1000",
        "MAXMSGSIZE": "1034",
        "SNDHWM": "10000",
        "XPUB_NODROP": "1",
        "XPUB_VERBOSE": "1",
        **pings,
    }
    for chan in ("shell", "control", "stdin"):
        assert eff[chan] == {"LINGER": "1000", "ROUTER_HANDOVER": "0", **pings}
    assert eff["hb"] == {"LINGER": "1000", "ROUTER_HANDOVER": "0"}


# --------------------------------------------------------------------------- IOPub HWM through the kernel

BURST = 2000
PAYLOAD = 16 * 1024
SUB_RCVHWM = 10
SUB_RCVBUF = 64 * 1024
BURST_CODE = (
    "from IPython.display import display\n"
    f"_p = 'x' * {PAYLOAD}\n"
    f"for _i in range({BURST}):\n"
    "    display({'text/plain': _p}, raw=True)\n"
)


def _tcp_wmem_max() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        return 4 * 1024 * 1024


def _burst_to_stalled_subscriber(k: RunningKernel) -> int:
    """Connect a SUB after start-up, run BURST_CODE, then count display_data it got."""
    from jupyter_client.blocking.client import BlockingKernelClient

    info = k.connection_info()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, SUB_RCVHWM)
        sub.setsockopt(zmq.RCVBUF, SUB_RCVBUF)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{info['iopub_port']}")

        client = BlockingKernelClient()
        client.load_connection_file(str(k.conn))
        client.start_channels(shell=True, iopub=True, stdin=False, hb=False)
        try:
            wait_ready(None, client, START_TIMEOUT)
            msg_id = client.execute(BURST_CODE, store_history=False)
            while True:
                reply = client.get_shell_msg(timeout=START_TIMEOUT)
                if reply["parent_header"].get("msg_id") == msg_id:
                    break
            assert reply["content"]["status"] == "ok", reply["content"]
            # The reply can overtake IOPub messages still queued inside the
            # kernel. Wait until the reading subscriber sees an idle that
            # follows the burst: the kernel's queue is FIFO, so by then every
            # display went out (or was dropped for the stalled subscriber).
            # With XPUB_NODROP=0 and a small SNDHWM the reading client may
            # itself lose part of the burst, idle included, so probe with
            # kernel_info requests until one probe's idle arrives.
            wanted = {msg_id}
            deadline = time.monotonic() + START_TIMEOUT
            while time.monotonic() < deadline:
                try:
                    msg = client.get_iopub_msg(timeout=2)
                except queue.Empty:
                    wanted.add(client.kernel_info())
                    continue
                if (
                    msg["msg_type"] == "status"
                    and msg["parent_header"].get("msg_id") in wanted
                    and msg["content"]["execution_state"] == "idle"
                ):
                    break
            else:
                raise AssertionError("the reading client never saw an idle after the burst")
        finally:
            client.stop_channels()

        displays = 0
        while sub.poll(1000):  # drain until quiet for 1 s
            frames = sub.recv_multipart()
            if any(b'"display_data"' in f for f in frames[:6]):
                displays += 1
        return displays
    finally:
        ctx.destroy(linger=0)


@pytest.mark.timeout(180)
def test_kernel_iopub_small_hwm_bounds_stalled_subscriber(start_kernel) -> None:  # type: ignore[no-untyped-def]
    n = 100
    k = start_kernel("--socket-option", f"iopub.SNDHWM={n}", "--socket-option", "iopub.XPUB_NODROP=0")
    assert k.effective_lines()["iopub"]["SNDHWM"] == str(n)
    got = _burst_to_stalled_subscriber(k)
    bound = n + SUB_RCVHWM + (_tcp_wmem_max() + 2 * SUB_RCVBUF) // PAYLOAD + 50
    assert bound < BURST
    assert 0 < got <= bound, (got, bound)


@pytest.mark.timeout(180)
def test_kernel_iopub_large_hwm_delivers_everything(start_kernel) -> None:  # type: ignore[no-untyped-def]
    k = start_kernel("--socket-option", f"iopub.SNDHWM={BURST * 2}", "--socket-option", "iopub.XPUB_NODROP=0")
    k.effective_lines()
    assert _burst_to_stalled_subscriber(k) == BURST


# --------------------------------------------------------------------------- kernelspec


@pytest.mark.timeout(180)
def test_installed_kernelspec_carries_options(tmp_path: Path) -> None:
    """``install --socket-option`` bakes argv; jupyter_client starts it with them.

    Assumes ``python -m trikernel install --prefix DIR [--name NAME]`` writes
    DIR/share/jupyter/kernels/NAME/kernel.json (ipykernel's layout).
    """
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    prefix = tmp_path / "prefix"
    proc = subprocess.run(
        [
            sys.executable, "-m", "trikernel", "install", "--prefix", str(prefix),
            "--socket-option", "iopub.SNDHWM=4321", "--socket-option", "*.TCP_KEEPALIVE=1",
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    kernels = prefix / "share" / "jupyter" / "kernels"
    (spec_file,) = kernels.glob("*/kernel.json")
    argv = json.loads(spec_file.read_text(encoding="utf-8"))["argv"]
    joined = " ".join(argv)
    assert "--socket-option *.TCP_KEEPALIVE=1" in joined
    assert "--socket-option iopub.SNDHWM=4321" in joined

    ksm = KernelSpecManager(kernel_dirs=[str(kernels)])
    km = KernelManager(kernel_name=spec_file.parent.name, kernel_spec_manager=ksm)
    km.connection_file = str(tmp_path / "km-conn.json")
    km.ip = "127.0.0.1"
    log_path = tmp_path / "kernel-stderr.log"
    with open(log_path, "w", encoding="utf-8") as log_file:
        km.start_kernel(extra_arguments=["--log-level", "DEBUG"], stderr=log_file, env=_env())
        try:
            client = km.client()
            client.start_channels()
            wait_ready(km, client, START_TIMEOUT)
            client.stop_channels()
        finally:
            km.shutdown_kernel(now=True)
    text = log_path.read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if EFFECTIVE in ln]
    iopub = [ln for ln in lines if f"{EFFECTIVE}iopub:" in ln]
    assert iopub, text
    assert "SNDHWM=4321" in iopub[0], text
    assert all("TCP_KEEPALIVE=1" in ln for ln in lines), text
    assert len(lines) == len(CHANNELS), text


@pytest.mark.timeout(180)
def test_kernel_honours_configured_nodrop_off(start_kernel) -> None:  # type: ignore[no-untyped-def]
    """``iopub.XPUB_NODROP=0`` stays off: a stalled subscriber never makes the kernel wait.

    The iopub task toggles NODROP around welcomes and fallback sends; it must
    restore the configured value, not 1. With NODROP on, the burst below would
    wait on the stalled subscriber and log the "not reading" warning.
    """
    k = start_kernel(
        "--socket-option", "iopub.SNDHWM=100", "--socket-option", "iopub.XPUB_NODROP=0",
        "--iopub-warn-after", "0.5", "--iopub-send-timeout", "30",
    )  # fmt: skip
    k.effective_lines()
    _burst_to_stalled_subscriber(k)
    text = k.stderr()
    assert "not reading" not in text, text
    assert "stalled past" not in text, text
