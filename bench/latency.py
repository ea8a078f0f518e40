"""Interactive latency: request/reply round trips, trikernel beside ipykernel and xeus-python.

Issue 12. A raw client (one DEALER per channel and a SUB, pyzmq only, no
jupyter_client threads: they add their own milliseconds) sends one request
at a time and times, with ``time.perf_counter``:

- ``execute``: ``execute_request`` of ``pass`` → its ``execute_reply``, and
  → its ``status: idle`` on IOPub;
- ``complete``: ``complete_request`` of ``import o`` (cursor at the end) → reply;
- ``inspect``: ``inspect_request`` of ``print`` → reply;
- ``kernel_info (flood)``: ``kernel_info_request`` on control → reply, while
  a cell prints in a loop (the client keeps draining IOPub meanwhile).

Rounds are interleaved across kernels (one request per kernel in turn), so
load on the machine hits every kernel alike; medians and p99 over
``--requests`` (default 300) per row, ratios against xeus-python. Signing
uses the connection's key (HMAC-SHA256), as every client does. Nothing is
asserted.

``--baseline REV ...`` adds trikernel as of each git revision (``git
archive`` of ``trikernel/`` on ``sys.path``), next to the checkout's own.

Usage: python bench/latency.py [--requests 300] [--baseline REV ...] [--kernels trikernel python3 xpython] [--json PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (
    RESULTS_DIR,
    available_kernels,
    baseline_kernelspecs,
    fmt,
    label,
    machine,
    md_table,
    now_iso,
    run_record,
    start_kernel,
    with_baselines,
    write_json,
)

DELIM = b"<IDS|MSG>"


class RawClient:
    """DEALERs on shell and control, a SUB on IOPub; messages signed by hand."""

    def __init__(self, info: dict[str, Any]):
        key = info["key"]
        self.key = key.encode() if isinstance(key, str) else key
        self.session = uuid.uuid4().hex
        self.ctx = zmq.Context()
        ip = info["ip"]
        self.shell = self._dealer(f"tcp://{ip}:{info['shell_port']}")
        self.control = self._dealer(f"tcp://{ip}:{info['control_port']}")
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.linger = 0
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(f"tcp://{ip}:{info['iopub_port']}")
        self._counter = 0
        self._wait_welcome()

    def _dealer(self, url: str) -> zmq.Socket[Any]:
        s = self.ctx.socket(zmq.DEALER)
        s.linger = 0
        s.setsockopt(zmq.IDENTITY, uuid.uuid4().hex.encode())
        s.connect(url)
        return s

    def _wait_welcome(self) -> None:
        # iopub_welcome (JEP 65) where the kernel sends one; else a status after kernel_info
        deadline = time.monotonic() + 10
        self.request(self.shell, "kernel_info_request", {})
        while time.monotonic() < deadline:
            if self.sub.poll(100):
                self.sub.recv_multipart()
                self.drain_iopub()
                return
            self.request(self.shell, "kernel_info_request", {})
        raise RuntimeError("IOPub never connected")

    def msg(self, msg_type: str, content: dict[str, Any]) -> tuple[str, list[bytes]]:
        self._counter += 1
        msg_id = f"{self.session}_{self._counter}"
        header = {
            "msg_id": msg_id,
            "msg_type": msg_type,
            "username": "bench",
            "session": self.session,
            "date": datetime.now(UTC).isoformat(),
            "version": "5.3",
        }
        parts = [json.dumps(x).encode() for x in (header, {}, {}, content)]
        sig = hmac.new(self.key, b"".join(parts), hashlib.sha256).hexdigest().encode()
        return msg_id, [DELIM, sig, *parts]

    def request(self, sock: zmq.Socket[Any], msg_type: str, content: dict[str, Any]) -> str:
        msg_id, frames = self.msg(msg_type, content)
        sock.send_multipart(frames)
        return msg_id

    def wait_reply(self, sock: zmq.Socket[Any], msg_id: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not sock.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                raise TimeoutError("no reply")
            frames = sock.recv_multipart()
            parent = json.loads(frames[frames.index(DELIM) + 3])
            if parent.get("msg_id") == msg_id:
                return

    def wait_idle(self, msg_id: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.sub.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                raise TimeoutError("no idle")
            frames = self.sub.recv_multipart()
            i = frames.index(DELIM)
            header = json.loads(frames[i + 2])
            if header.get("msg_type") != "status":
                continue
            parent = json.loads(frames[i + 3])
            if parent.get("msg_id") == msg_id and b'"idle"' in frames[i + 5]:
                return

    def drain_iopub(self) -> None:
        while self.sub.poll(50):
            self.sub.recv_multipart()

    def close(self) -> None:
        self.ctx.destroy(linger=0)


EXECUTE = {"code": "pass", "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False}


def one_execute(c: RawClient) -> tuple[float, float]:
    t0 = time.perf_counter()
    msg_id = c.request(c.shell, "execute_request", EXECUTE)
    c.wait_reply(c.shell, msg_id)
    t1 = time.perf_counter()
    c.wait_idle(msg_id)
    return t1 - t0, time.perf_counter() - t0


def one_request(c: RawClient, msg_type: str, content: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    msg_id = c.request(c.shell, msg_type, content)
    c.wait_reply(c.shell, msg_id)
    t = time.perf_counter() - t0
    c.wait_idle(msg_id)
    return t


#: A cell that prints as fast as it can for FLOOD_SECONDS (no interrupt
#: needed: xeus-python does not interrupt a Python loop).
FLOOD_SECONDS = 4.0
FLOOD = f"import time\n_end = time.time() + {FLOOD_SECONDS}\nwhile time.time() < _end:\n    print('flood')"


def flood_kernel_info(c: RawClient, n: int) -> list[float]:
    """kernel_info on control while a cell floods stdout; IOPub drained by a thread."""
    stop = threading.Event()
    sub_lock = threading.Lock()

    def drain() -> None:
        while not stop.is_set():
            with sub_lock:
                if c.sub.poll(10):
                    c.sub.recv_multipart()

    flood_id = c.request(c.shell, "execute_request", {**EXECUTE, "code": FLOOD})
    t = threading.Thread(target=drain, daemon=True)
    t.start()
    time.sleep(0.5)  # let the flood get going (no event marks "flooding" for a raw client)
    out = []
    end = time.monotonic() + FLOOD_SECONDS - 1.0
    while len(out) < n and time.monotonic() < end:
        t0 = time.perf_counter()
        msg_id = c.request(c.control, "kernel_info_request", {})
        c.wait_reply(c.control, msg_id)
        out.append(time.perf_counter() - t0)
        time.sleep(0.002)
    c.wait_reply(c.shell, flood_id, timeout=60)
    stop.set()
    t.join(5)
    c.drain_iopub()
    return out


def stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    p99 = xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]
    return {"median_ms": statistics.median(xs) * 1000, "p99_ms": p99 * 1000, "n": len(xs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--flood-requests", type=int, default=100)
    ap.add_argument("--kernels", nargs="*", default=None)
    ap.add_argument("--baseline", nargs="*", default=[], help="git revisions of trikernel to compare with")
    ap.add_argument("--json", default=str(RESULTS_DIR / "latency.json"))
    args = ap.parse_args()
    root = pathlib.Path(tempfile.mkdtemp(prefix="bench-latency-"))
    bases = baseline_kernelspecs(args.baseline, root)
    names = with_baselines(available_kernels(args.kernels), bases)  # beside the first (trikernel)
    load = {"start": os.getloadavg()}
    kernels = {n: start_kernel(n, log_tag="-latency") for n in names}
    clients = {n: RawClient(k.km.get_connection_info()) for n, k in kernels.items()}
    rows: dict[str, dict[str, list[float]]] = {
        n: {"execute reply": [], "execute idle": [], "complete": [], "inspect": []} for n in names
    }
    try:
        for _ in range(20):  # warm-up: imports, completer caches
            for c in clients.values():
                one_execute(c)
                one_request(c, "complete_request", {"code": "import o", "cursor_pos": 8})
                one_request(c, "inspect_request", {"code": "print", "cursor_pos": 5, "detail_level": 0})
        for _ in range(args.requests):
            for n, c in clients.items():
                r, i = one_execute(c)
                rows[n]["execute reply"].append(r)
                rows[n]["execute idle"].append(i)
            for n, c in clients.items():
                rows[n]["complete"].append(one_request(c, "complete_request", {"code": "import o", "cursor_pos": 8}))
            for n, c in clients.items():
                rows[n]["inspect"].append(
                    one_request(c, "inspect_request", {"code": "print", "cursor_pos": 5, "detail_level": 0})
                )
        for n, c in clients.items():
            rows[n]["kernel_info (flood)"] = flood_kernel_info(c, args.flood_requests)
        load["end"] = os.getloadavg()
    finally:
        for c in clients.values():
            c.close()
        for k in kernels.values():
            k.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    result = {n: {row: stats(xs) for row, xs in r.items()} for n, r in rows.items()}
    base = "xpython" if "xpython" in result else names[0]
    table = []
    for row in rows[names[0]]:
        cells: list[Any] = [row]
        for n in names:
            s = result[n][row]
            cells.append(f"{fmt(s['median_ms'])} / {fmt(s['p99_ms'])}")
        for n in names:
            if n != base:
                a, b = result[n][row]["median_ms"], result[base][row]["median_ms"]
                cells.append(f"{a / b:.2f}x" if b else "n/a")
        table.append(cells)
    headers = [
        "round trip (median / p99 ms)",
        *[label(n) for n in names],
        *[f"{label(n)} / {label(base)}" for n in names if n != base],
    ]
    text = (
        f"# latency ({now_iso()}, {machine()}; load average at start {load['start'][0]:.2f},"
        f" at end {load['end'][0]:.2f})\n\n" + md_table(headers, table)
    )
    print(text)
    write_json(pathlib.Path(args.json), run_record(load, args.baseline, bases, results=result))
    (RESULTS_DIR / "latency.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
