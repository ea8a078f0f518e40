"""``--message-log FILE`` (issue 14, part 2): one JSON line per message in and out.

- Tier 2, in process: :class:`trikernel.messagelog.MessageLog` fed real
  wire frames (wire.serialize, signed): the fields of a line, the content
  bound, redaction of the key and the CurveZMQ secret, a writer stuck on
  its file (the producer never waits; drops are counted, reported in the
  log and add up), a file that refuses writes.
- Tier 3, real kernels driven by jupyter_client: one line per message each
  way with the fields; no key, no CurveZMQ secret, no signature in the
  file (``%connect_info`` prints them); a flood while the writer is stuck
  on a FIFO nobody reads: the kernel serves on and every message is either
  a line or counted; ``%trikernel log`` shows the tail; a file that cannot
  be opened stops start-up with one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import (
    TIMEOUT,
    collect_outputs,
    execute,
    make_kernelspec,
    message_log_lines,
    start_kernel,
    stdout_of,
    stop_kernel,
)

from trikernel.launch.config import KernelConfig
from trikernel.protocol.connection import ConnectionInfo
from trikernel.protocol.messages import MessageBuilder
from trikernel.protocol.wire import Signer, serialize
from trikernel.server.messagelog import REDACTED, MessageLog, summary

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.timeout(180)

KEY = "0b9b1b3f-5d0e-4c47-9a6e-3a2f5b7c8d9e"
CURVE_SECRET = "D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs"  # 40 Z85 characters


def _messages(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rec for rec in lines if "dir" in rec]


def _open(tmp_path: Any, **kw: Any) -> tuple[MessageLog, str]:
    path = str(tmp_path / "messages.jsonl")
    config = KernelConfig(message_log=path, **kw)
    conn = ConnectionInfo(key=KEY.encode(), curve_publickey=b"x" * 40, curve_secretkey=CURVE_SECRET.encode())
    return _open_with(config, conn), path


def _open_with(config: KernelConfig, conn: ConnectionInfo) -> MessageLog:
    return MessageLog.open(
        config.message_log,
        conn,
        strict=config.strict,
        content_bytes=config.message_log_content,
        capacity=config.message_log_queue,
    )


SIGNER = Signer(KEY.encode())
BUILDER = MessageBuilder()


def _frames(msg_type: str, content: dict[str, Any], **kw: Any) -> list[bytes]:
    return serialize(BUILDER.msg(msg_type, content, **kw), SIGNER)


# ---------------------------------------------------------------- tier 2: in process


def test_a_line_has_the_fields_and_never_the_signature(tmp_path: Any) -> None:
    mlog, path = _open(tmp_path)
    request = BUILDER.msg("execute_request", {"code": "1+1"}, identities=(b"\x00\xffclient",))
    frames_in = serialize(request, SIGNER)
    frames_out = _frames("execute_reply", {"status": "ok"}, parent_header=request.header, buffers=(b"abc", b"de"))
    mlog.record("in", "shell", frames_in)
    mlog.record("out", "shell", frames_out, {"undelivered": True})
    mlog.close()
    lines = message_log_lines(path)
    assert [rec.get("event") for rec in lines] == ["opened", None, None, "closed"]
    assert lines[0]["strict"] is False
    assert lines[0]["content_bound"] == 4096
    first, second = _messages(lines)
    assert list(first)[:4] == ["time", "dir", "channel", "identities"]
    assert first["dir"] == "in"
    assert first["channel"] == "shell"
    assert first["identities"] == [b"\x00\xffclient".hex()]
    assert first["msg_type"] == "execute_request"
    assert first["header"] == request.header
    assert first["parent_header"] == {}
    assert first["metadata"] == {}
    assert first["content"] == {"code": "1+1"}
    assert first["content_bytes"] == len(frames_in[-1])
    assert second["parent_header"]["msg_id"] == request.msg_id
    assert second["buffers"] == [3, 2]
    assert second["undelivered"] is True
    text = Path(path).read_text(encoding="utf-8")
    for frames in (frames_in, frames_out):
        assert frames[frames.index(b"<IDS|MSG>") + 1].decode() not in text  # the signature
    assert lines[-1]["lines"] == 2
    assert lines[-1]["dropped"] == 0


def test_lines_are_the_same_without_orjson(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer puts frames into lines as they are (orjson.Fragment, or
    text when orjson is not installed); the lines parse to the same."""
    from trikernel.server import messagelog

    request = BUILDER.msg("execute_request", {"code": "print('é\\n')", "n": [1.5, None, True]})
    frames = serialize(request, SIGNER)
    pretty = [*frames[:5], json.dumps(request.content, indent=1).encode()]  # spans lines: parsed, not put in
    seen = []
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(messagelog, "_orjson", None)
        mlog, path = _open_in(tmp_path, fast)
        mlog.record("in", "shell", frames)
        mlog.record("in", "shell", pretty)
        mlog.close()
        seen.append([{k: v for k, v in rec.items() if k != "time"} for rec in _messages(message_log_lines(path))])
    assert seen[0] == seen[1]
    assert seen[0][0]["content"] == request.content
    assert seen[0][1]["content"] == request.content


def _open_in(tmp_path: Any, tag: object) -> tuple[MessageLog, str]:
    d = tmp_path / str(tag)
    d.mkdir()
    return _open(d)


def test_odd_frames_are_logged_by_their_sizes(tmp_path: Any) -> None:
    """No delimiter, many identities, a big buffer: sizes only, bounded."""
    mlog, path = _open(tmp_path)
    mlog.record("in", "shell", [b"a" * 10, b"{}", b"{}"], {"dropped": "no_delimiter", "detail": "no <IDS|MSG>"})
    frames = _frames("comm_msg", {"comm_id": "c", "data": {}}, buffers=(b"\0" * 100_000,))
    mlog.record("in", "shell", [bytes([i]) for i in range(20)] + frames)
    mlog.close()
    nodelim, many = _messages(message_log_lines(path))
    assert nodelim["frames"] == [10, 2, 2]
    assert nodelim["identities"] == []
    assert nodelim["dropped"] == "no_delimiter"
    assert many["identities"] == [bytes([i]).hex() for i in range(16)]
    assert many["identities_more"] == 4
    assert many["buffers"] == [100_000]
    assert many["content"] == {"comm_id": "c", "data": {}}


def test_content_past_the_bound_is_cut_and_its_size_kept(tmp_path: Any) -> None:
    mlog, path = _open(tmp_path, message_log_content=100)
    big = {"code": "x" * 5000}
    frames = _frames("execute_request", big)
    mlog.record("in", "shell", frames)
    mlog.close()
    (rec,) = _messages(message_log_lines(path))
    assert "content" not in rec
    assert rec["content_bytes"] == len(frames[-1]) > 5000
    assert rec["content_cut"] == frames[-1][:100].decode()
    assert rec["header"]["msg_type"] == "execute_request"  # headers are kept whole


def test_key_and_curve_secret_are_redacted(tmp_path: Any) -> None:
    mlog, path = _open(tmp_path, message_log_content=200)
    printed = json.dumps({"key": KEY, "curve_secretkey": CURVE_SECRET})  # what %connect_info prints
    mlog.record("out", "iopub", _frames("stream", {"name": "stdout", "text": printed}))
    head = "y" * (200 - len('{"name":"stdout","text":"') - 10)
    mlog.record("out", "iopub", _frames("stream", {"name": "stdout", "text": head + KEY}))  # cut inside the key
    mlog.close()
    text = Path(path).read_text(encoding="utf-8")
    assert KEY not in text
    assert CURVE_SECRET not in text
    assert KEY[:10] not in text
    whole, cut = _messages(message_log_lines(path))
    assert json.loads(whole["content"]["text"]) == {"key": REDACTED, "curve_secretkey": REDACTED}
    assert cut["content_cut"].endswith(REDACTED)


class _StuckFile:
    """A file whose writes wait until released: a disk that does not answer."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.chunks: list[str] = []

    def write(self, text: str) -> int:
        self.entered.set()
        self.release.wait(TIMEOUT)
        self.chunks.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_stuck_writer_never_blocks_the_producer_and_drops_add_up() -> None:
    stuck = _StuckFile()
    stuck.release.set()  # let the "opened" line through
    mlog = MessageLog(stuck, "stuck", content_bytes=4096, capacity=50)  # type: ignore[arg-type]
    stuck.release.clear()
    stuck.entered.clear()
    frames = _frames("display_data", {"data": {"text/plain": "1"}, "metadata": {}})
    mlog.record("out", "iopub", frames)
    assert stuck.entered.wait(TIMEOUT)  # the writer is inside write() now, and stays there
    n = 5000
    for _ in range(n):
        mlog.record("out", "iopub", frames)  # returns at once: the test would hang otherwise
    st = mlog.statistics()
    assert st.queued == 50
    assert st.dropped == n - 50
    assert st.dropped_by == {"out iopub": n - 50}
    stuck.release.set()
    mlog.close()
    assert all(chunk.endswith("\n") for chunk in stuck.chunks)  # each write ends on a line boundary
    lines = [json.loads(line) for chunk in stuck.chunks for line in chunk.splitlines()]
    messages = _messages(lines)
    dropped_events = [rec for rec in lines if rec.get("event") == "dropped"]
    assert len(messages) == 1 + 50
    assert sum(rec["lines"] for rec in dropped_events) == n - 50 == dropped_events[-1]["total"]
    assert dropped_events[-1]["by"] == {"out iopub": n - 50}
    closed = lines[-1]
    assert closed["event"] == "closed"
    assert closed["lines"] == len(messages)
    assert closed["dropped"] == n - 50
    assert len(messages) + closed["dropped"] == n + 1  # every record: a line or counted


def test_a_reader_leaves_the_line_still_being_written(tmp_path: Any) -> None:
    """The docs' reading rule (conformance.md, the message log), as the tests
    apply it: CI once read an ``input_request`` line cut at ``"password":fal``
    while the writer thread was in the middle of it."""
    path = tmp_path / "log.jsonl"
    path.write_text('{"dir":"in","n":1}\n{"dir":"out","content":{"prompt":"? ","password":fal')
    assert message_log_lines(str(path)) == [{"dir": "in", "n": 1}]
    with path.open("a") as f:
        f.write("se}}\n")
    assert message_log_lines(str(path))[-1] == {"dir": "out", "content": {"prompt": "? ", "password": False}}


class _BrokenFile(_StuckFile):
    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")


def test_a_file_that_refuses_writes_is_counted_not_fatal() -> None:
    mlog = MessageLog(_BrokenFile(), "broken", content_bytes=4096, capacity=100)  # type: ignore[arg-type]
    for _ in range(3):
        mlog.record("in", "shell", _frames("kernel_info_request", {}))
    mlog.tail(3)  # waits until the writer handled them
    mlog.close()
    st = mlog.statistics()
    assert st.lines == 3
    assert st.unwritten >= 3


def test_tail_and_summary(tmp_path: Any) -> None:
    mlog, _ = _open(tmp_path)
    ids = []
    for i in range(30):
        msg = BUILDER.msg("execute_request", {"code": str(i)})
        ids.append(msg.msg_id)
        mlog.record("in", "shell", serialize(msg, SIGNER), {"violations": ["content.code: expected a string"]})
    tail = mlog.tail(5)
    assert [rec["header"]["msg_id"] for rec in tail] == ids[-5:]
    row = summary(tail[-1])
    assert "in " in row
    assert "shell" in row
    assert "execute_request" in row
    assert ids[-1] in row
    assert "REFUSED: content.code: expected a string" in row
    mlog.close()


# ---------------------------------------------------------------- tier 3: real kernels


@pytest.fixture
def log_kernel(jupyter_path: str, tmp_path: Any) -> Iterator[tuple[Any, Any, str]]:
    path = str(tmp_path / "kernel-messages.jsonl")
    name = f"trikernel-test-log-{uuid.uuid4().hex[:8]}"
    make_kernelspec(jupyter_path, name, extra_argv=["--message-log", path])
    km, kc = start_kernel(name, transport_encryption="required")
    yield km, kc, path
    stop_kernel(km, kc)


def _sent(kc: Any, channel: str, msg_type: str, content: dict[str, Any]) -> tuple[str, bytes]:
    """Send a request through jupyter_client's Session by hand; returns its
    msg_id and the signature it went out with."""
    msg = kc.session.msg(msg_type, content)
    frames = kc.session.serialize(msg)
    getattr(kc, f"{channel}_channel").socket.send_multipart(frames)
    return msg["header"]["msg_id"], frames[frames.index(b"<IDS|MSG>") + 1]


def test_one_line_per_message_each_way_and_no_secrets(log_kernel: tuple[Any, Any, str]) -> None:
    km, kc, path = log_kernel
    info = km.get_connection_info()
    assert info.get("curve_secretkey"), "jupyter_client provisioned no CurveZMQ keys"
    received: list[dict[str, Any]] = []
    sent: list[tuple[str, str]] = []  # (channel, msg_id)
    reply, outputs = execute(kc, "print('hello'); 6 * 7")
    sent.append(("shell", reply["parent_header"]["msg_id"]))
    received += [reply, *outputs]
    reply, outputs = execute(kc, "%connect_info")
    sent.append(("shell", reply["parent_header"]["msg_id"]))
    received += [reply, *outputs]
    key = info["key"].decode() if isinstance(info["key"], bytes) else info["key"]
    assert key in stdout_of(outputs)  # %connect_info printed the key...
    msg_id, signature = _sent(kc, "control", "kernel_info_request", {})
    sent.append(("control", msg_id))
    received.append(kc.get_control_msg(timeout=TIMEOUT))
    received += collect_outputs(kc, msg_id)
    stop_kernel(km, kc)
    lines = message_log_lines(path)
    assert lines[0]["event"] == "opened"
    assert lines[-1]["event"] == "closed"
    assert lines[-1]["dropped"] == 0
    messages = _messages(lines)
    # (jupyter_client's KernelManager and its clients may reuse one msg_id on
    # different channels: their Sessions share the session id and counter)
    by_id: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rec in messages:
        by_id.setdefault((rec["channel"], rec["header"]["msg_id"]), []).append(rec)
    assert all(len(v) == 1 for v in by_id.values()), "a message was logged twice"
    for channel, mid in sent:
        (rec,) = by_id[channel, mid]
        assert rec["dir"] == "in"
        assert rec["identities"]
        assert all(len(bytes.fromhex(i)) > 0 for i in rec["identities"])
    channels = {"execute_reply": "shell", "kernel_info_reply": "control"}
    for m in received:
        (rec,) = by_id[channels.get(m["msg_type"], "iopub"), m["header"]["msg_id"]]
        assert rec["dir"] == "out"
        assert rec["msg_type"] == m["msg_type"]
        assert rec["parent_header"].get("msg_id") == m["parent_header"].get("msg_id")
        assert rec["content_bytes"] > 0
        assert "time" in rec
        assert rec["content"] == json.loads(json.dumps(m["content"], default=str)) or m["msg_type"] == "stream"
    text = Path(path).read_text(encoding="utf-8")
    secrets = [v.decode() if isinstance(v, bytes) else v for v in (info["key"], info["curve_secretkey"], signature)]
    for secret in secrets:
        assert secret not in text  # ...and the log has none of them
    assert REDACTED in text


def test_tail_magic_shows_the_lastmessage_log_lines(log_kernel: tuple[Any, Any, str]) -> None:
    _, kc, _ = log_kernel
    first, _ = execute(kc, "x = 1")
    reply, outputs = execute(kc, "%trikernel log 6")
    assert reply["content"]["status"] == "ok"
    out = stdout_of(outputs).splitlines()
    assert out[0].startswith("message log ")
    assert "none dropped" in out[0]
    assert "the last 6:" in out[0]
    rows = out[1:]
    assert len(rows) == 6
    own = reply["parent_header"]["msg_id"]
    mine = [i for i, r in enumerate(rows) if "in   shell    execute_request" in r and f"id={own}" in r]
    before = [i for i, r in enumerate(rows) if f"id={first['header']['msg_id']}" in r and "execute_reply" in r]
    assert mine, rows
    assert before, rows
    assert before[0] < mine[0], rows  # the previous cell's reply, then the magic's own request
    reply, outputs = execute(kc, "%trikernel")
    assert "message_log_dropped: 0" in stdout_of(outputs)


def test_tail_magic_without_a_log_says_how_to_get_one(kernel: tuple[Any, Any]) -> None:
    _, kc = kernel
    reply, _outputs = execute(kc, "%trikernel log")
    assert reply["content"]["status"] == "error"
    assert "--message-log FILE" in reply["content"]["evalue"]


def test_a_flood_with_the_writer_stuck_is_served_and_accounted(jupyter_path: str, tmp_path: Any) -> None:
    """The log's file is a FIFO nobody reads during the flood: the writer
    blocks once the pipe is full, the 64-line queue fills, and the kernel
    still delivers all 3,000 displays; afterwards every message is a line
    or counted in a ``dropped`` line."""
    fifo = str(tmp_path / "messages.fifo")
    os.mkfifo(fifo)
    reader_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so the kernel's open() does not block
    name = f"trikernel-test-logfifo-{uuid.uuid4().hex[:8]}"
    make_kernelspec(jupyter_path, name, extra_argv=["--message-log", fifo, "--message-log-queue", "64"])
    km, kc = start_kernel(name)
    chunks: list[bytes] = []
    try:
        n = 3000
        reply, outputs = execute(kc, f"from IPython.display import display\nfor i in range({n}): display(i)")
        assert reply["content"]["status"] == "ok"
        displays = [m for m in outputs if m["msg_type"] == "display_data"]
        assert [m["content"]["data"]["text/plain"] for m in displays] == [str(i) for i in range(n)]
        reply, outputs = execute(kc, "%trikernel")
        stats = stdout_of(outputs)
        dropped = int(stats.split("message_log_dropped: ")[1].split()[0])
        assert dropped > 0, stats

        def drain() -> None:
            os.set_blocking(reader_fd, True)
            while chunk := os.read(reader_fd, 1 << 16):
                chunks.append(chunk)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        msg_id = kc.kernel_info()
        kc.get_shell_msg(timeout=TIMEOUT)
        collect_outputs(kc, msg_id)
        stop_kernel(km, kc)
        reader.join(TIMEOUT)
        assert not reader.is_alive()
    finally:
        if km.is_alive():
            km.shutdown_kernel(now=True)
        os.close(reader_fd)
    lines = [json.loads(line) for line in b"".join(chunks).decode().splitlines()]
    closed = lines[-1]
    assert closed["event"] == "closed"
    messages = _messages(lines)
    drops = [rec for rec in lines if rec.get("event") == "dropped"]
    assert drops
    assert sum(rec["lines"] for rec in drops) == closed["dropped"] >= dropped
    assert closed["lines"] == len(messages)
    by = closed["by"]
    # every shell message each way, and every IOPub message, is a line or counted
    sent_shell = 2 + 1 + 1  # kernel_info (wait_for_ready), the flood, %trikernel, kernel_info
    in_shell = sum(1 for r in messages if r["dir"] == "in" and r["channel"] == "shell")
    out_shell = sum(1 for r in messages if r["dir"] == "out" and r["channel"] == "shell")
    assert in_shell + by.get("in shell", 0) >= sent_shell  # wait_for_ready may send more than one
    assert out_shell + by.get("out shell", 0) == in_shell + by.get("in shell", 0)  # one reply each
    out_iopub = sum(1 for r in messages if r["dir"] == "out" and r["channel"] == "iopub")
    assert out_iopub + by.get("out iopub", 0) >= n + 4  # displays, busy, execute_input, idle...


def test_a_log_file_that_cannot_be_opened_stops_start_up(tmp_path: Any) -> None:
    conn = tmp_path / "conn.json"
    conn.write_text(json.dumps({"key": KEY, "transport": "tcp", "ip": "127.0.0.1"}))
    conn.chmod(0o600)  # as jupyter_client writes it: a key file others can read is a warning line of its own
    bad = tmp_path / "no-such-dir" / "log.jsonl"
    r = subprocess.run(
        [sys.executable, "-m", "trikernel", "-f", str(conn), "--message-log", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("trikernel: --message-log: cannot open"), r.stderr
    assert str(bad) in r.stderr


def test_a_getpass_answer_and_an_escaped_key_are_redacted(tmp_path: Any) -> None:
    """The answer to getpass() (an input_reply to an input_request with
    password: true) is never written; a plain input() answer is. A key with
    a quote or non-ASCII character appears JSON-escaped in a line: redacted
    as well (both found by a reviewer)."""
    path = str(tmp_path / "messages.jsonl")
    odd_key = 'quote"key\\é-12345'
    conn = ConnectionInfo(key=odd_key.encode())
    mlog = _open_with(KernelConfig(message_log=path), conn)
    ask_pw = BUILDER.msg("input_request", {"prompt": "pw: ", "password": True})
    ask_plain = BUILDER.msg("input_request", {"prompt": "name: ", "password": False})
    mlog.record("out", "stdin", serialize(ask_pw, SIGNER))
    mlog.record("in", "stdin", _frames("input_reply", {"value": "Sup3rS3cretPW"}, parent_header=ask_pw.header))
    mlog.record("out", "stdin", serialize(ask_plain, SIGNER))
    mlog.record("in", "stdin", _frames("input_reply", {"value": "Ada"}, parent_header=ask_plain.header))
    mlog.record("out", "iopub", _frames("stream", {"name": "stdout", "text": json.dumps({"key": odd_key})}))
    mlog.close()
    text = Path(path).read_text(encoding="utf-8")
    assert "Sup3rS3cretPW" not in text
    assert "Ada" in text
    assert json.dumps(odd_key)[1:-1] not in text
    assert json.dumps(odd_key, ensure_ascii=False)[1:-1] not in text
    replies = [m for m in _messages(message_log_lines(path)) if m["msg_type"] == "input_reply"]
    assert [r["content"]["value"] for r in replies] == [REDACTED, "Ada"]


def test_frames_received_as_views_are_logged_as_bytes(tmp_path: Any) -> None:
    """Frames over 64 KiB arrive as memoryviews of libzmq's buffer
    (server/sockets.py): within ``--message-log-content`` the content is
    still logged whole (copied, so the log holds no view), past it cut."""
    mlog, path = _open(tmp_path, message_log_content=1 << 20)
    whole = _frames("execute_request", {"code": "x" * (100 << 10)})
    cut = _frames("execute_request", {"code": "y" * (2 << 20)})
    for frames in (whole, cut):
        mlog.record("in", "shell", [memoryview(f) if len(f) > 1 << 16 else f for f in frames])
    mlog.close()
    first, second = _messages(message_log_lines(path))
    assert first["content"] == {"code": "x" * (100 << 10)}
    assert "content" not in second
    assert second["content_bytes"] == len(cut[-1])
    assert second["content_cut"] == cut[-1][: 1 << 20].decode()
