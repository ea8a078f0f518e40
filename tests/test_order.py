"""Tier 3: order across channels (issue 26, item 3; vscode-jupyter#13039).

Before a message leaves on stdin (an ``input_request``) or a reply on
shell, every IOPub message the same request produced before it has been
handed to the IOPub socket: what a cell prints before ``input()`` reaches
the client before the prompt, and what it prints before it returns before
its ``execute_reply``.

Two views of each round. The kernel's, exact: its ``--message-log``
records each IOPub message after libzmq took it and each reply and
``input_request`` where it is sent, so the log's order is the order of the
hand-overs; it must be right every time. The client's: one loop polls the
SUB, shell and stdin sockets together and, whenever anything is ready,
reads everything the SUB holds first, then one message of shell or stdin.
libzmq does not order two sockets: in a scratch script (no kernel, one
thread sending three XPUB messages and then one ROUTER message, the client
polling as here, 3000 rounds) the ROUTER message was read first in 14-102
rounds, and in 803 with the client's sockets in two contexts. So the
client's view is held to at most ARRIVAL_SLACK rounds of PROMPTS; before
issue 26 it was every round.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import zmq
from conftest import TIMEOUT, make_kernelspec, message_log_lines, start_kernel, stop_kernel

pytestmark = pytest.mark.timeout(180)

PROMPTS = 20
#: Rounds the client may see out of order (module docstring): libzmq's own
#: reordering across sockets, seen in 6 of 600 rounds here with the other
#: core busy.
ARRIVAL_SLACK = 3


class OrderClient:
    """Raw DEALERs on shell, stdin and control and a SUB, signed with the
    kernel's session; :meth:`until` records what arrives, in order."""

    def __init__(self, km: Any, kc: Any):
        self.session = kc.session
        info = km.get_connection_info()
        self.ctx = zmq.Context()
        ident = uuid.uuid4().hex.encode()  # not the jupyter_client channels' identity
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(f"tcp://{info['ip']}:{info['iopub_port']}")
        self.sockets: dict[str, zmq.Socket[bytes]] = {}
        for channel in ("shell", "stdin", "control"):
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, ident)
            s.connect(f"tcp://{info['ip']}:{info[channel + '_port']}")
            self.sockets[channel] = s
        self.poller = zmq.Poller()
        for s in (self.sub, self.sockets["shell"], self.sockets["stdin"]):
            self.poller.register(s, zmq.POLLIN)
        self.until(lambda ch, m: m["msg_type"] == "iopub_welcome")  # JEP 65: subscribed

    def close(self) -> None:
        self.ctx.destroy(linger=0)

    def send(self, channel: str, msg_type: str, content: dict[str, Any], **kw: Any) -> dict[str, Any]:
        msg = self.session.msg(msg_type, content, **kw)
        self.session.send(self.sockets[channel], msg)
        return msg

    def execute(self, code: str, **header: Any) -> str:
        content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}}
        msg = self.session.msg("execute_request", {**content, "allow_stdin": True, "stop_on_error": True})
        msg["header"].update(header)
        self.session.send(self.sockets["shell"], msg)
        return str(msg["header"]["msg_id"])

    def _read(self, s: zmq.Socket[bytes]) -> dict[str, Any]:
        _idents, frames = self.session.feed_identities(s.recv_multipart())
        return dict(self.session.deserialize(frames))

    def until(self, done: Any, timeout: float = TIMEOUT) -> list[tuple[str, dict[str, Any]]]:
        """Read until ``done(channel, msg)``; every (channel, msg) read, in arrival order."""
        seen: list[tuple[str, dict[str, Any]]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.poller.poll(100):
                continue
            ready = [("iopub", self.sub)] * bool(self.sub.poll(0))
            ready += [(ch, self.sockets[ch]) for ch in ("shell", "stdin") if self.sockets[ch].poll(0)]
            for ch, s in ready:
                while True:  # IOPub drained first; one message of the others
                    m = self._read(s)
                    seen.append((ch, m))
                    if done(ch, m):
                        return seen
                    if ch != "iopub" or not s.poll(0):
                        break
        raise AssertionError(f"timed out; read {[(ch, m['msg_type']) for ch, m in seen]}")

    def control(self, msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
        msg = self.send("control", msg_type, content)
        s = self.sockets["control"]
        while True:
            assert s.poll(TIMEOUT * 1000), f"no {msg_type} reply"
            r = self._read(s)
            if r["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return r


def kinds(seen: list[tuple[str, dict[str, Any]]], msg_id: str) -> list[tuple[str, str]]:
    return [(ch, m["msg_type"]) for ch, m in seen if m["parent_header"].get("msg_id") == msg_id]


def is_idle(msg_id: str) -> Any:
    return lambda ch, m: (
        m["msg_type"] == "status"
        and m["content"]["execution_state"] == "idle"
        and m["parent_header"].get("msg_id") == msg_id
    )


class KernelLog:
    """The kernel's ``--message-log``: what it handed to each socket, in order."""

    def __init__(self, path: str):
        self.path = path

    def sent(self, msg_id: str, last: tuple[str, str]) -> list[tuple[str, str]]:
        """(channel, msg_type, or a status's state) of what the kernel sent with parent ``msg_id``,
        once the line ``last`` is written (the writer thread lags a little)."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            lines = message_log_lines(self.path)
            out = [
                (d["channel"], d["content"]["execution_state"] if d["msg_type"] == "status" else d["msg_type"])
                for d in lines
                if d.get("dir") == "out" and d.get("parent_header", {}).get("msg_id") == msg_id
            ]
            if last in out or time.monotonic() > deadline:
                return out
            time.sleep(0.01)  # the log's writer thread gathers for 5 ms; no event reaches the test


@pytest.fixture(scope="module")
def logged(jupyter_path: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = str(tmp_path_factory.mktemp("order") / "messages.log")
    make_kernelspec(jupyter_path, "trikernel-order-log", extra_argv=["--message-log", path])
    km, kc = start_kernel("trikernel-order-log")
    c = OrderClient(km, kc)
    yield c, KernelLog(path)
    c.close()
    stop_kernel(km, kc)


@pytest.fixture(scope="module")
def oc(logged: tuple[OrderClient, KernelLog]) -> OrderClient:
    return logged[0]


@pytest.fixture(scope="module")
def plain(jupyter_path: str) -> Any:
    """A kernel without the log: replies leave from the thread that ran the cell when nothing is queued."""
    km, kc = start_kernel("trikernel-test-signal")
    c = OrderClient(km, kc)
    yield c
    c.close()
    stop_kernel(km, kc)


def _before(got: list[tuple[str, str]], first: set[str], then: tuple[str, str]) -> bool:
    """Every msg_type in ``first`` is in ``got`` ahead of ``then``."""
    return then in got and first <= {t for _ch, t in got[: got.index(then)]}


def _prompts_after_their_text(logged: tuple[OrderClient, KernelLog], code: str, **header: Any) -> None:
    """``code`` prints "text-N" and then calls input (or getpass) once; in
    each of PROMPTS rounds the kernel hands the text's stream message to
    the XPUB before it sends the prompt, and the client reads it first (but
    for libzmq's own reordering, ARRIVAL_SLACK)."""
    oc, log = logged
    kernel_late, client_late = [], []
    for i in range(PROMPTS):
        msg_id = oc.execute(code.replace("N", str(i)), **header)
        seen = oc.until(lambda ch, m: ch == "stdin")
        prompt = seen[-1][1]
        text = "".join(m["content"]["text"] for ch, m in seen if m["msg_type"] == "stream")
        if f"text-{i}" not in text:
            client_late.append((i, kinds(seen, msg_id)))
        oc.send("stdin", "input_reply", {"value": "v"}, parent=prompt["header"])
        oc.until(is_idle(msg_id))
        sent = log.sent(msg_id, ("iopub", "idle"))
        if not _before(sent, {"stream"}, ("stdin", "input_request")):
            kernel_late.append((i, sent))
    assert kernel_late == [], f"{len(kernel_late)} of {PROMPTS} prompts sent before their text: {kernel_late[:3]}"
    assert len(client_late) <= ARRIVAL_SLACK, f"{len(client_late)} of {PROMPTS} prompts came first: {client_late[:3]}"


def test_text_printed_before_input_arrives_before_the_prompt(logged: tuple[OrderClient, KernelLog]) -> None:
    _prompts_after_their_text(logged, "print('text-N'); x = input('? ')")


def test_text_printed_before_getpass_arrives_before_the_prompt(logged: tuple[OrderClient, KernelLog]) -> None:
    _prompts_after_their_text(logged, "import getpass\nprint('text-N'); x = getpass.getpass()")


def test_fd_output_before_input_arrives_before_the_prompt(logged: tuple[OrderClient, KernelLog]) -> None:
    """What reaches fd 1 (a subprocess, C code, os.write) before input()."""
    _prompts_after_their_text(logged, "import os\nos.write(1, b'text-N\\n'); x = input('? ')")


def test_text_printed_before_input_in_a_thread_arrives_before_the_prompt(
    logged: tuple[OrderClient, KernelLog],
) -> None:
    code = (
        "import threading\n"
        "def ask():\n    print('text-N'); input('? ')\n"
        "t = threading.Thread(target=ask); t.start(); t.join()"
    )
    _prompts_after_their_text(logged, code)


def test_text_printed_before_input_in_a_subshell_arrives_before_the_prompt(
    logged: tuple[OrderClient, KernelLog],
) -> None:
    oc = logged[0]
    reply = oc.control("create_subshell_request", {})
    subshell_id = reply["content"]["subshell_id"]
    try:
        _prompts_after_their_text(logged, "print('text-N'); x = input('? ')", subshell_id=subshell_id)
    finally:
        oc.control("delete_subshell_request", {"subshell_id": subshell_id})


def _replies_after_their_output(oc: OrderClient, log: KernelLog | None) -> None:
    """print-then-return, and print-then-raise (a failed execute's reply is
    sent by the io run): stream (and error) before execute_reply."""
    kernel_late, client_late = [], []
    for i in range(PROMPTS):
        code = f"print('text-{i}')" if i % 2 else f"print('text-{i}'); raise ValueError({i})"
        msg_id = oc.execute(code)
        got: list[tuple[str, str]] = []

        def done(ch: str, m: dict[str, Any], msg_id: str = msg_id, got: list[tuple[str, str]] = got) -> bool:
            if m["parent_header"].get("msg_id") == msg_id:
                got.append((ch, m["content"]["execution_state"] if m["msg_type"] == "status" else m["msg_type"]))
            return ("shell", "execute_reply") in got and ("iopub", "idle") in got

        oc.until(done)
        outputs = {"stream"} if i % 2 else {"stream", "error"}
        if not _before(got, outputs, ("shell", "execute_reply")):
            client_late.append((i, got))
        if log is not None:
            sent = log.sent(msg_id, ("iopub", "idle"))
            if not _before(sent, outputs, ("shell", "execute_reply")):
                kernel_late.append((i, sent))
    assert kernel_late == [], f"{len(kernel_late)} of {PROMPTS} replies sent before their output: {kernel_late[:3]}"
    assert len(client_late) <= ARRIVAL_SLACK, f"{len(client_late)} of {PROMPTS} replies came first: {client_late[:3]}"


def test_text_printed_before_a_cell_returns_is_sent_before_its_reply(logged: tuple[OrderClient, KernelLog]) -> None:
    _replies_after_their_output(*logged)


def test_a_reply_from_the_cells_own_thread_arrives_after_its_output(plain: OrderClient) -> None:
    """Without the log the reply of a cell that succeeded leaves from its
    thread when nothing is queued, else from the iopub task. Only the
    client's view here (the log moves every reply to the io run); it is a
    weak one: before issue 26 the client read 1 of 20 replies first, since
    the output left 0.1-0.3 ms after the reply and the loop reads the SUB
    first when both are ready. The hand-over order is the logged tests'."""
    _replies_after_their_output(plain, None)
