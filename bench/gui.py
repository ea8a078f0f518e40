"""What hosting the user trio run on a GUI loop costs (issue 16 section 1; issue 12 latency).

Kernels (one each, requests interleaved across them, as bench/latency.py):

- ``plain``: trikernel as it starts (guestrun.py drives trio's loop as
  ``trio.run`` does);
- ``baseline`` (with ``--baseline SRC``): trikernel from another source
  tree, e.g. main's checkout before this driver, to show the plain run did
  not get slower;
- ``tk``: after ``%gui tk`` (no display needed: the host is a Tcl
  interpreter without a window);
- ``qt``: after ``%gui qt`` with ``QT_QPA_PLATFORM=offscreen`` (skipped
  without a Qt binding).

Rows, median / p99 over ``--requests``:

- ``execute reply`` / ``execute idle``: ``execute_request`` of ``pass`` →
  its reply / its idle (bench/latency.py's raw client);
- ``trio timer lateness``: a ``trikernel.nursery`` task sleeps 10 ms
  ``--wakeups`` times while the kernel is idle; how late each wake-up is;
- ``GUI timer lateness``: ``tcl.after(10)`` / ``QTimer.singleShot(10)``
  rescheduled from its own callback while the kernel is idle; how late each
  callback is (a GUI callback's wake-up latency when trio is the guest).

Nothing is asserted. Usage:
python bench/gui.py [--requests 300] [--wakeups 200] [--baseline /path/to/trikernel-src] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import RESULTS_DIR, fmt, machine, md_table, now_iso, start_kernel, versions, write_json
from latency import RawClient, one_execute

HAS_QT = any(importlib.util.find_spec(m) is not None for m in ("PySide6", "PyQt6"))

# Each returns a list of lateness figures in seconds, measured inside the kernel while idle.
TRIO_TIMER = """
import time, trio
_late = []
async def _probe(n):
    for _ in range(n):
        due = time.perf_counter() + 0.01
        await trio.sleep(0.01)
        _late.append(time.perf_counter() - due)
_done = trio.Event()
async def _run(n):
    await _probe(n)
    _done.set()
nursery.start_soon(_run, {n})
"""
TK_TIMER = """
import time, tkinter
_tcl = tkinter.Tcl()
_late = []
_done = trio.Event()
def _tick(due, left):
    _late.append(time.perf_counter() - due)
    if left:
        _tcl.after(10, _tick, time.perf_counter() + 0.01, left - 1)
    else:
        _done.set()
_tcl.after(10, _tick, time.perf_counter() + 0.01, {n} - 1)
"""
QT_TIMER = """
import time
from IPython.external.qt_for_kernel import QtCore
_late = []
_done = trio.Event()
_timer = QtCore.QTimer()
_timer.setSingleShot(True)
_timer.setTimerType(QtCore.Qt.TimerType.PreciseTimer)
_state = {"due": 0.0, "left": {n}}
def _tick():
    _late.append(time.perf_counter() - _state["due"])
    _state["left"] -= 1
    if _state["left"]:
        _state["due"] = time.perf_counter() + 0.01
        _timer.start(10)
    else:
        _done.set()
_timer.timeout.connect(_tick)
_state["due"] = time.perf_counter() + 0.01
_timer.start(10)
"""
COLLECT = "await _done.wait()\nimport json as _json\nprint('LATE', _json.dumps(_late))"


def run_cell_text(c: RawClient, code: str) -> str:
    """Run ``code``; its stdout (the raw client reads IOPub itself)."""
    msg_id = c.request(c.shell, "execute_request", {**_EXECUTE, "code": code})
    text = ""
    while True:
        if not c.sub.poll(60_000):
            raise TimeoutError(code)
        frames = c.sub.recv_multipart()
        i = frames.index(b"<IDS|MSG>")
        header, parent, content = (json.loads(frames[i + k]) for k in (2, 3, 5))
        if parent.get("msg_id") != msg_id:
            continue
        if header["msg_type"] == "stream":
            text += content["text"]
        elif header["msg_type"] == "error":
            raise RuntimeError(f"{content['ename']}: {content['evalue']}")
        elif header["msg_type"] == "status" and content["execution_state"] == "idle":
            c.wait_reply(c.shell, msg_id)
            return text


_EXECUTE = {"silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}


def lateness(c: RawClient, setup: str, n: int) -> list[float]:
    run_cell_text(c, setup.replace("{n}", str(n)))  # the probe runs while the kernel is idle
    out = run_cell_text(c, COLLECT)
    return [float(x) for x in json.loads(out.split("LATE", 1)[1])]


def stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    p99 = xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]
    return {"median_ms": statistics.median(xs) * 1000, "p99_ms": p99 * 1000, "n": len(xs)}


def baseline_spec(src: str, root: str) -> str:
    d = os.path.join(root, "kernels", "trikernel-baseline")
    os.makedirs(d, exist_ok=True)
    spec = {
        # -P: not the current directory first, so PYTHONPATH's trikernel is the one imported
        "argv": [sys.executable, "-P", "-m", "trikernel", "-f", "{connection_file}"],
        "display_name": "trikernel baseline",
        "language": "python",
        "env": {"PYTHONPATH": os.path.abspath(src)},
    }
    with open(os.path.join(d, "kernel.json"), "w") as f:
        json.dump(spec, f)
    return "trikernel-baseline"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--wakeups", type=int, default=200)
    ap.add_argument("--baseline", default=None, help="a trikernel source tree to compare the plain run with")
    ap.add_argument("--json", default=str(RESULTS_DIR / "gui.json"))
    args = ap.parse_args()
    os.environ["QT_QPA_PLATFORM"] = "offscreen"  # kernels inherit it; Qt draws nowhere
    tmp = tempfile.mkdtemp(prefix="trikernel-bench-gui-")
    os.environ["JUPYTER_PATH"] = os.path.join(tmp) + os.pathsep + os.environ.get("JUPYTER_PATH", "")
    setups = {"plain": ("trikernel", None), "tk": ("trikernel", "%gui tk")}
    if HAS_QT:
        setups["qt"] = ("trikernel", "%gui qt")
    if args.baseline:
        setups = {"baseline": (baseline_spec(args.baseline, tmp), None), **setups}
    kernels = {n: start_kernel(spec, log_tag=f"-gui-{n}") for n, (spec, _) in setups.items()}
    rows: dict[str, dict[str, list[float]]] = {n: {"execute reply": [], "execute idle": []} for n in setups}
    try:
        clients = {n: RawClient(k.km.get_connection_info()) for n, k in kernels.items()}
        for n, (_, magic) in setups.items():
            if magic:
                run_cell_text(clients[n], magic)
        for _ in range(20):  # warm-up
            for c in clients.values():
                one_execute(c)
        for _ in range(args.requests):
            for n, c in clients.items():
                r, i = one_execute(c)
                rows[n]["execute reply"].append(r)
                rows[n]["execute idle"].append(i)
        for n, c in clients.items():
            rows[n]["trio timer lateness (10 ms)"] = lateness(c, TRIO_TIMER, args.wakeups)
        rows["tk"]["GUI timer lateness (10 ms)"] = lateness(clients["tk"], TK_TIMER, args.wakeups)
        if "qt" in clients:
            rows["qt"]["GUI timer lateness (10 ms)"] = lateness(clients["qt"], QT_TIMER, args.wakeups)
        for c in clients.values():
            c.close()
    finally:
        for k in kernels.values():
            k.shutdown()
    result = {n: {row: stats(xs) for row, xs in r.items()} for n, r in rows.items()}
    names = list(setups)
    base = "baseline" if "baseline" in names else "plain"
    row_names = ["execute reply", "execute idle", "trio timer lateness (10 ms)", "GUI timer lateness (10 ms)"]
    table = []
    for row in row_names:
        cells: list[Any] = [row]
        for n in names:
            s = result[n].get(row)
            cells.append(f"{fmt(s['median_ms'])} / {fmt(s['p99_ms'])}" if s else "—")
        for n in names:
            if n == base:
                continue
            a, b = result[n].get(row), result[base].get(row)
            cells.append(f"{a['median_ms'] / b['median_ms']:.2f}x" if a and b and b["median_ms"] else "—")
        table.append(cells)
    headers = ["median / p99 ms", *names, *[f"{n} / {base}" for n in names if n != base]]
    text = f"# GUI hosting ({now_iso()}, {machine()})\n\n" + md_table(headers, table)
    print(text)
    write_json(__import__("pathlib").Path(args.json), {"versions": versions(), "results": result})
    (RESULTS_DIR / "gui.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
