"""Real programs as clients: jupyter_server (JupyterLab's backend) over its
websocket, jupyter console, and the heartbeat under a GIL-holding cell."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
import zmq
from conftest import TIMEOUT, wait_for_marker, which

pytestmark = pytest.mark.timeout(180)


def test_heartbeat_answers_while_user_code_holds_the_gil(kernel):
    km, kc = kernel
    msg_id = kc.execute(
        "import time\nprint('STARTED', flush=True)\nt = time.time()\nwhile time.time() - t < 3:\n    pass"
    )
    ctx = zmq.Context()
    try:
        hb = ctx.socket(zmq.REQ)
        hb.linger = 0
        hb.connect(f"tcp://127.0.0.1:{km.hb_port}")
        wait_for_marker(kc, msg_id)  # the busy loop is running (for 3 s)
        rtts = []
        for _ in range(5):
            t0 = time.monotonic()
            hb.send(b"ping")
            assert hb.poll(1000), "heartbeat did not answer within 1 s"
            assert hb.recv() == b"ping"
            rtts.append(time.monotonic() - t0)
        assert max(rtts) < 0.5, rtts
    finally:
        ctx.destroy(0)
    while kc.get_shell_msg(timeout=TIMEOUT)["parent_header"].get("msg_id") != msg_id:
        pass


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def server(tmp_path):
    pytest.importorskip("jupyter_server")
    port = _free_port()
    token = uuid.uuid4().hex
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"))
    p = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", f"--ServerApp.port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={token}", "--ServerApp.open_browser=False", f"--ServerApp.root_dir={tmp_path}",
         "--allow-root"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
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
                pytest.fail("jupyter_server did not start")
            time.sleep(0.2)
    yield base, token
    p.terminate()
    p.wait(timeout=30)


def test_jupyter_server_websocket_runs_a_cell(server):
    """The path JupyterLab takes: REST to start the kernel, websocket for messages."""
    import websocket  # websocket-client, a jupyter_server dependency

    base, token = server
    req = urllib.request.Request(
        f"{base}/api/kernels?token={token}", data=json.dumps({"name": "trikernel"}).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    kernel = json.load(urllib.request.urlopen(req, timeout=60))
    ws = websocket.create_connection(
        f"{base.replace('http', 'ws')}/api/kernels/{kernel['id']}/channels?token={token}", timeout=TIMEOUT
    )
    try:
        msg_id = uuid.uuid4().hex
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "t", "session": uuid.uuid4().hex,
                       "date": "2026-01-01T00:00:00Z", "version": "5.5"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": "import trio\nawait trio.sleep(0)\nprint('via jupyter_server'); 6*7", "silent": False,
                        "store_history": True, "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        }))  # fmt: skip
        seen: dict[str, object] = {}
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and not ("idle" in seen and "reply" in seen):
            m = json.loads(ws.recv())
            if m.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            t = m["msg_type"]
            if t == "stream":
                seen["stream"] = m["content"]["text"]
            elif t == "execute_result":
                seen["result"] = m["content"]["data"]["text/plain"]
            elif t == "execute_reply":
                seen["reply"] = m["content"]["status"]
            elif t == "status" and m["content"]["execution_state"] == "idle":
                seen["idle"] = True
        assert seen == {"stream": "via jupyter_server\n", "result": "42", "reply": "ok", "idle": True}
    finally:
        ws.close()
        urllib.request.urlopen(
            urllib.request.Request(f"{base}/api/kernels/{kernel['id']}?token={token}", method="DELETE"), timeout=60
        )


def test_jupyter_console_runs_code():
    pytest.importorskip("jupyter_console")
    r = subprocess.run(
        [which("jupyter"), "console", "--kernel=trikernel", "--simple-prompt", "-y"],
        input="print(6 * 7)\nimport trio; await trio.sleep(0); print('trio ok')\nexit\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout)
    assert "42" in out, (r.stdout[-2000:], r.stderr[-2000:])
    assert "trio ok" in out, (r.stdout[-2000:], r.stderr[-2000:])
