"""asyncio beside trio (issue 24): what the adapter costs a cell, trikernel beside ipykernel.

Kernels, started side by side and driven interleaved (one request per
kernel in turn, the first of each round rotating, so load on the machine
hits every kernel alike):

- ``trikernel``: the default, ``%autoawait asyncio`` (the adapter on);
- ``trikernel --autoawait trio``: pure trio, no adapter on the cells' path;
- ``trikernel-REV`` for each ``--baseline REV`` (``git archive`` of that
  commit, e.g. main before this change), for the ``pass`` round trip;
- ipykernel (``python3``): asyncio only.

Rows:

- ``pass``: ``execute_request`` → ``execute_reply`` and → IOPub ``idle``
  (bench/latency.py's raw client: pyzmq, signed by hand), median and p99
  over ``--requests``; and, steadier on a loaded machine, the main thread's
  CPU time of one ``get_ipython().run_cell("pass")`` inside the kernel
  (2,000 per cell, median over ``--reps`` cells);
- ``10,000 await trio.sleep(0)`` and ``10,000 await asyncio.sleep(0)``, a
  top-level ``for`` loop in one cell: wall time and the main thread's CPU
  time (``time.thread_time``) inside the kernel, per await, median over
  ``--reps`` cells; a kernel that cannot run the cell (ipykernel and trio,
  pure trio and asyncio) says why.

Compare a change with its base as ``--baseline HEAD main``: two kernels
started the same way (``git archive``, ``python -c``). The installed
``trikernel`` kernelspec starts differently (``-Xfrozen_modules=off``, the
editable install) and was 3-7 % off a baseline of the *same* commit.

Nothing is asserted. Usage: python bench/asyncio_cells.py [--requests 300]
[--reps 7] [--awaits 10000] [--baseline REV ...] [--json PATH]

(Not ``bench/asyncio.py``: the scripts run with bench/ first on
``sys.path``, where that name would shadow the standard library's asyncio.)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (
    RESULTS_DIR,
    available_kernels,
    baseline_kernelspec,
    fmt,
    label,
    machine,
    md_table,
    now_iso,
    start_kernel,
    versions,
    write_json,
)
from latency import DELIM, EXECUTE, RawClient, one_execute, stats

TRIO_MODE = "trikernel-autoawait-trio"

LOOP = """\
import time as _time, asyncio as _asyncio, trio as _trio
_w0, _c0 = _time.perf_counter(), _time.thread_time()
for _ in range({n}):
    await {call}
_r = (_time.perf_counter() - _w0, _time.thread_time() - _c0)
"""
LOOPS = {"trio.sleep(0)": "_trio.sleep(0)", "asyncio.sleep(0)": "_asyncio.sleep(0)"}

#: IPython's whole path for one sync cell, inside the kernel (no sockets):
#: steadier than a round trip on a loaded machine
RUN_CELL = """\
import time as _time
_sh = get_ipython()
for _ in range(50):
    _sh.run_cell("pass", store_history=False)
_w0, _c0 = _time.perf_counter(), _time.thread_time()
for _ in range({n}):
    _sh.run_cell("pass", store_history=False)
_r = (_time.perf_counter() - _w0, _time.thread_time() - _c0)
"""
RUN_CELLS = 2000


def trio_mode_kernelspec(root: pathlib.Path) -> str:
    """A copy of the ``trikernel`` kernelspec started with ``--autoawait trio``."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("trikernel")
    d = root / "kernels" / TRIO_MODE
    d.mkdir(parents=True)
    argv = [*spec.argv, "--autoawait", "trio"]
    (d / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": TRIO_MODE, "language": "python", "env": spec.env})
    )
    return TRIO_MODE


def run_loop(c: RawClient, code: str) -> tuple[float, float] | str:
    """Run ``code``; its ``_r`` (wall, CPU seconds), or the error's name and value."""
    msg_id = c.request(c.shell, "execute_request", {**EXECUTE, "code": code, "user_expressions": {"r": "_r"}})
    deadline = time.monotonic() + 300
    while True:
        if not c.shell.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            raise TimeoutError("no reply")
        frames = c.shell.recv_multipart()
        i = frames.index(DELIM)
        if json.loads(frames[i + 3]).get("msg_id") == msg_id:
            content = json.loads(frames[i + 5])
            break
    c.wait_idle(msg_id)
    if content["status"] != "ok":
        return f"{content.get('ename')}: {content.get('evalue', '')[:60]}"
    r = content["user_expressions"]["r"]
    if r.get("status") != "ok":
        return f"{r.get('ename')}: {r.get('evalue', '')[:60]}"
    wall, cpu = (float(x) for x in r["data"]["text/plain"].strip("()").split(","))
    return wall, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--awaits", type=int, default=10_000)
    ap.add_argument("--baseline", nargs="*", default=[], help="git revisions of trikernel for the pass round trip")
    ap.add_argument("--json", default=str(RESULTS_DIR / "asyncio_cells.json"))
    args = ap.parse_args()
    root = pathlib.Path(tempfile.mkdtemp(prefix="bench-asyncio-"))
    names = [*available_kernels(["trikernel"]), trio_mode_kernelspec(root)]
    names += [baseline_kernelspec(rev, root) for rev in args.baseline]
    names += available_kernels(["python3"])
    os.environ["JUPYTER_PATH"] = str(root) + os.pathsep + os.environ.get("JUPYTER_PATH", "")
    kernels = {n: start_kernel(n, log_tag="-asyncio") for n in names}
    clients = {n: RawClient(k.km.get_connection_info()) for n, k in kernels.items()}
    passes: dict[str, dict[str, list[float]]] = {n: {"reply": [], "idle": []} for n in names}
    loops: dict[str, dict[str, list[tuple[float, float]] | str]] = {n: {k: [] for k in LOOPS} for n in names}
    run_cells: dict[str, list[float]] = {n: [] for n in names}
    try:
        for _ in range(20):  # warm-up
            for c in clients.values():
                one_execute(c)
        order = list(clients.items())
        for i in range(args.requests):
            for n, c in order[i % len(order) :] + order[: i % len(order)]:  # who goes first rotates
                reply, idle = one_execute(c)
                passes[n]["reply"].append(reply)
                passes[n]["idle"].append(idle)
        for i in range(args.reps):
            for n, c in order[i % len(order) :] + order[: i % len(order)]:
                r = run_loop(c, RUN_CELL.format(n=RUN_CELLS))
                if not isinstance(r, str):
                    run_cells[n].append(r[1] / RUN_CELLS)
            for what, call in LOOPS.items():
                for n, c in clients.items():
                    if n.startswith("trikernel-") and n != TRIO_MODE:
                        continue  # a baseline: the pass round trip only
                    got = loops[n][what]
                    if isinstance(got, str):
                        continue
                    r = run_loop(c, LOOP.format(n=args.awaits, call=call))
                    if isinstance(r, str):
                        loops[n][what] = r  # this kernel cannot run it: why, once
                    else:
                        got.append(r)
    finally:
        for c in clients.values():
            c.close()
        for k in kernels.values():
            k.shutdown()
        shutil.rmtree(root, ignore_errors=True)

    result: dict[str, Any] = {}
    rows = []
    first = names[0]
    for n in names:
        rep, idle = stats(passes[n]["reply"]), stats(passes[n]["idle"])
        cpu = statistics.median(run_cells[n]) * 1e6 if run_cells[n] else float("nan")
        result[n] = {"pass": {"reply": rep, "idle": idle}, "run_cell_cpu_us": cpu}
        first_cpu = result[first]["run_cell_cpu_us"]
        rows.append(
            [
                f"`pass`, {label(n)}",
                f"{fmt(rep['median_ms'], 3)} / {fmt(rep['p99_ms'], 3)} ms",
                f"{fmt(idle['median_ms'], 3)} / {fmt(idle['p99_ms'], 3)} ms",
                f"{rep['median_ms'] / result[first]['pass']['reply']['median_ms']:.3f}x",
                f"{fmt(cpu, 1)} us",
                f"{cpu / first_cpu:.3f}x",
            ]
        )
    text = f"# asyncio cells ({now_iso()}, {machine()})\n\n"
    headers = ["round trip", "reply (median / p99)", "idle (median / p99)", f"reply / {label(first)}"]
    headers += ["run_cell('pass') CPU", f"CPU / {label(first)}"]
    text += md_table(headers, rows)
    loop_rows = []
    for what in LOOPS:
        for n in names:
            got = loops[n][what]
            if n.startswith("trikernel-") and n != TRIO_MODE:
                continue
            if isinstance(got, str):
                loop_rows.append([f"{args.awaits:,} `await {what}`", label(n), got, ""])
                result[n][what] = got
                continue
            wall = statistics.median(w for w, _ in got) / args.awaits * 1e6
            cpu = statistics.median(c for _, c in got) / args.awaits * 1e6
            result[n][what] = {"wall_us": wall, "cpu_us": cpu, "n": len(got)}
            loop_rows.append([f"{args.awaits:,} `await {what}`", label(n), f"{wall:.2f} us", f"{cpu:.2f} us"])
    text += "\n\n" + md_table(["cell", "kernel", "wall per await (median)", "thread CPU per await"], loop_rows)
    print(text)
    write_json(pathlib.Path(args.json), {"versions": versions(), "results": result})
    (RESULTS_DIR / "asyncio_cells.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
