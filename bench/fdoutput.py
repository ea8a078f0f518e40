"""fd 1/2 output: throughput, the GIL-holding writer, cost per cell, late output.

Compares, with real kernels in subprocesses driven by jupyter_client:

- ``trikernel``: this tree (fd 1/2 drained by the relay process, flushed
  before every reply; trikernel/user/fdcapture.py);
- ``trikernel-REV``: trikernel at each ``--baseline`` revision (default
  b491ff5: the pipe drained by a kernel thread, no flush), run from
  ``git archive REV``;
- ``ipykernel`` (``python3``): its pipe-and-thread capture.

Figures (nothing is asserted):

(a) subprocess MB/s: a cell runs a child Python that writes ``--mb`` MB to
    fd 1 in 100-byte lines; time from execute_request sent until every byte
    arrived as ``stream`` text (and until idle), MB/s = bytes / time.
(b) in-kernel MB/s: the same amount written by the cell itself with
    ``os.write(1, ...)`` (which releases the GIL).
(c) GIL held: one ``write(1, buf, 10 MB)`` through ``ctypes.PyDLL`` (the GIL
    stays held); completes or hangs (killed after ``--hang-timeout`` s). A
    fresh kernel per kernelspec.
(d) cost per cell: median time to idle of ``--cells`` cells of ``pass`` and
    of ``os.write(1, b"x\\n")``, and how many of the latter got their text
    after their idle (late).
(e) cost of a print: a cell of ``--prints`` (100,000) ``print(i)`` calls,
    timed in the kernel (``perf_counter`` around the loop), to idle, and in
    CPU seconds of the kernel process (psutil, execute_request sent to idle:
    steadier than wall time on a loaded machine); and a cell of
    ``--prints // 10`` rounds of ``os.write(1, ...)`` then ``print`` (each
    print finds fd output in flight: trikernel publishes it first, one round
    trip to the relay), timed the same way. ``--reps`` trials, interleaved
    across the kernels; medians (and the best loop time).

Usage: python bench/fdoutput.py [--reps 3] [--mb 20] [--cells 200] [--prints 100000]
       [--only prints] [--baseline b491ff5 [REV ...]] [--kernels trikernel trikernel-b491ff5 python3]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
from typing import Any

import zmq

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import (
    DELIM,
    RESULTS_DIR,
    baseline_kernelspec,
    drain_iopub,
    fmt,
    label,
    md_table,
    median,
    start_kernel,
    write_json,
)
from jupyter_client.kernelspec import KernelSpecManager

WRITER = (
    "import os, sys\n"
    "line = b'x' * 99 + b'\\n'\n"
    "block = line * 640\n"  # 64000 bytes per write
    "for i in range(int(sys.argv[1]) * 1000000 // len(block)):\n"
    "    os.write(1, block)\n"
)


class Reader:
    """Counts stream bytes and finds the idle of one request on the raw SUB socket."""

    def __init__(self, kc: Any):
        self.kc = kc
        self.sock = kc.iopub_channel.socket

    def run(self, code: str, expect: int, timeout: float) -> dict[str, Any]:
        drain_iopub(self.kc, 0.1)
        t0 = time.perf_counter()
        msg_id = self.kc.execute(code, store_history=False)
        mid = msg_id.encode()
        got = before_idle = 0
        idle_at = all_at = None
        deadline = t0 + timeout
        while (idle_at is None or got < expect) and time.perf_counter() < deadline:
            if not self.sock.poll(50):
                continue
            while True:
                try:
                    frames = self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                parts = frames[frames.index(DELIM) + 1 :]
                if mid not in parts[2]:
                    continue
                mtype = json.loads(parts[1])["msg_type"]
                if mtype == "stream":
                    got += len(json.loads(parts[4])["text"].encode())
                    if got >= expect and all_at is None:
                        all_at = time.perf_counter() - t0
                elif mtype == "status" and b'"idle"' in parts[4]:
                    idle_at = time.perf_counter() - t0
                    before_idle = got
        return {"to_all": all_at, "to_idle": idle_at, "bytes": got, "before_idle": before_idle, "expect": expect}


def bench_throughput(names: list[str], reps: int, mb: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kernels = {n: start_kernel(n, log_tag="-fdoutput") for n in names}
    try:
        readers = {n: Reader(k.kc) for n, k in kernels.items()}
        for r in readers.values():
            r.run("import os, subprocess, sys", 0, 30)
        expect = mb * 1000000 // 64000 * 64000
        sub = f"subprocess.run([sys.executable, '-c', {WRITER!r}, '{mb}'])"
        inproc = (
            "line = b'x' * 99 + b'\\n'\nblock = line * 640\n"
            f"for i in range({expect // 64000}):\n    os.write(1, block)\n"
        )
        for _ in range(reps):
            for n, r in readers.items():
                out.setdefault(n, {"sub": [], "inproc": []})
                out[n]["sub"].append(r.run(sub, expect, 120))
                out[n]["inproc"].append(r.run(inproc, expect, 120))
    finally:
        for k in kernels.values():
            k.shutdown()
    return out


def bench_gil(names: list[str], hang_timeout: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    code = "import ctypes\nlibc = ctypes.PyDLL(None)\nbuf = b'y' * 10000000\nlibc.write(1, buf, len(buf))"
    for n in names:
        k = start_kernel(n, log_tag="-fdoutput-gil")
        try:
            Reader(k.kc).run("pass", 0, 30)
            out[n] = Reader(k.kc).run(code, 10000000, hang_timeout)
        finally:
            k.kc.stop_channels()
            k.km.shutdown_kernel(now=True)
    return out


def bench_cells(names: list[str], cells: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kernels = {n: start_kernel(n, log_tag="-fdoutput-cells") for n in names}
    try:
        for n, k in kernels.items():
            r = Reader(k.kc)
            r.run("import os", 0, 30)
            empty = [r.run("pass", 0, 30)["to_idle"] for _ in range(cells)]
            writes = [r.run("os.write(1, b'x\\n')", 2, 30) for _ in range(cells)]
            out[n] = {
                "pass_ms": median([e * 1000 for e in empty if e is not None]),
                "write_ms": median([w["to_idle"] * 1000 for w in writes if w["to_idle"] is not None]),
                "late": sum(1 for w in writes if w["before_idle"] < 2),
                "cells": cells,
            }
    finally:
        for k in kernels.values():
            k.shutdown()
    return out


PRINT_CELL = "_t0 = time.perf_counter()\nfor i in range({n}):\n    print(i)\n_dt = time.perf_counter() - _t0"
MIXED_CELL = (
    "_t0 = time.perf_counter()\nfor i in range({n}):\n    os.write(1, b'x\\n')\n    print(i)\n"
    "_dt = time.perf_counter() - _t0"
)


def _timed(r: Reader, proc: Any, code: str, expect: int) -> tuple[float, float, float]:
    """(seconds in the kernel, seconds to idle, CPU seconds of the kernel process from
    execute_request sent until idle) of one timed cell; the cell sets ``_dt``."""
    cpu0 = proc.cpu_times()
    got = r.run(code, expect, 300)
    cpu1 = proc.cpu_times()
    msg_id = r.kc.execute("", user_expressions={"dt": "_dt"}, store_history=False)
    while True:
        m = r.kc.get_shell_msg(timeout=60)
        if m["parent_header"].get("msg_id") == msg_id:
            dt = float(m["content"]["user_expressions"]["dt"]["data"]["text/plain"])
            cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
            return dt, got["to_idle"] or float("nan"), cpu


def bench_prints(names: list[str], n: int, reps: int) -> dict[str, Any]:
    import psutil

    keys = ("print_s", "print_idle_s", "print_cpu_s", "mixed_s", "mixed_cpu_s")
    out: dict[str, Any] = {name: {k: [] for k in keys} for name in names}
    kernels = {name: start_kernel(name, log_tag="-fdoutput-prints") for name in names}
    try:
        readers = {name: Reader(k.kc) for name, k in kernels.items()}
        procs = {name: psutil.Process(k.pid) for name, k in kernels.items()}
        for name, r in readers.items():
            r.run("import os, time", 0, 30)
            _timed(r, procs[name], PRINT_CELL.format(n=n // 10), 1)  # warm-up
        line_bytes = sum(len(f"{i}\n") for i in range(n))
        for _ in range(reps):
            for name, r in readers.items():
                dt, idle, cpu = _timed(r, procs[name], PRINT_CELL.format(n=n), line_bytes)
                out[name]["print_s"].append(dt)
                out[name]["print_idle_s"].append(idle)
                out[name]["print_cpu_s"].append(cpu)
            for name, r in readers.items():
                dt, _, cpu = _timed(r, procs[name], MIXED_CELL.format(n=n // 10), 1)
                out[name]["mixed_s"].append(dt)
                out[name]["mixed_cpu_s"].append(cpu)
    finally:
        for k in kernels.values():
            k.shutdown()
    return {name: {k: median(v) for k, v in d.items()} | {"trials": d} for name, d in out.items()}


def prints_table(names: list[str], prints: dict[str, Any], n: int, load: str) -> str:
    m = n // 10
    rows = [
        [
            label(name),
            fmt(prints[name]["print_s"] / n * 1e6, 2),
            fmt(min(prints[name]["trials"]["print_s"]) / n * 1e6, 2),
            fmt(prints[name]["print_idle_s"], 3),
            fmt(prints[name]["print_cpu_s"] / n * 1e6, 2),
            fmt(prints[name]["mixed_s"] / m * 1e6, 1),
            fmt(prints[name]["mixed_cpu_s"] / m * 1e6, 1),
        ]
        for name in names
    ]
    header = [
        "kernel",
        "`print(i)`, us each (median)",
        "(best)",
        f"{n:,} prints, s to idle",
        "kernel CPU, us per print",
        "`os.write(1, ...)` + `print`, us per round",
        "kernel CPU, us per round",
    ]
    return f"### cost of a print (load average {load})\n\n" + md_table(header, rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mb", type=int, default=20)
    ap.add_argument("--cells", type=int, default=200)
    ap.add_argument("--hang-timeout", type=float, default=10.0)
    ap.add_argument("--prints", type=int, default=100000)
    ap.add_argument("--only", choices=["prints"], default=None, help="run only figure (e)")
    ap.add_argument("--baseline", nargs="+", default=["b491ff5"], help="git revisions to compare with")
    ap.add_argument("--kernels", nargs="*", default=None)
    ap.add_argument("--json", default=str(RESULTS_DIR / "fdoutput.json"))
    args = ap.parse_args()

    root = pathlib.Path(tempfile.mkdtemp(prefix="bench-fdoutput-"))
    try:
        bases = [baseline_kernelspec(rev, root) for rev in args.baseline]
        os.environ["JUPYTER_PATH"] = str(root) + os.pathsep + os.environ.get("JUPYTER_PATH", "")
        specs = KernelSpecManager().find_kernel_specs()
        names = [n for n in (args.kernels or ["trikernel", *bases, "python3"]) if n in specs]
        print("fdoutput: kernels", ", ".join(names), file=sys.stderr, flush=True)
        load0 = os.getloadavg()
        prints = bench_prints(names, args.prints, args.reps)
        load = f"{min(load0[0], os.getloadavg()[0]):.1f}-{max(load0[0], os.getloadavg()[0]):.1f}"
        print("fdoutput: prints done", file=sys.stderr, flush=True)
        if args.only == "prints":
            text = prints_table(names, prints, args.prints, load)
            print(text)
            path = pathlib.Path(args.json).with_name("fdoutput-prints.json")
            write_json(path, {"prints": prints, "kernels": names, "load": load})
            return 0
        thr = bench_throughput(names, args.reps, args.mb)
        print("fdoutput: throughput done", file=sys.stderr, flush=True)
        cells = bench_cells(names, args.cells)
        print("fdoutput: cells done", file=sys.stderr, flush=True)
        gil = bench_gil(names, args.hang_timeout)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def mbps(runs: list[dict[str, Any]]) -> float:
        return median([r["bytes"] / 1e6 / r["to_all"] for r in runs if r["to_all"]])

    ref = "python3"
    rows = []
    for n in names:
        sub, inproc = thr[n]["sub"], thr[n]["inproc"]
        c, g = cells[n], gil[n]
        gil_txt = (
            f"{g['to_all']:.2f} s, {g['bytes']:,} B"
            if g["to_all"]
            else f"hung ({g['bytes']:,} B in {args.hang_timeout:.0f} s)"
        )
        rows.append(
            [
                label(n),
                fmt(mbps(sub)),
                fmt(median([r["before_idle"] / r["expect"] * 100 for r in sub])) + " %",
                fmt(mbps(inproc)),
                gil_txt,
                fmt(c["pass_ms"], 2),
                fmt(c["write_ms"], 2),
                f"{c['late']}/{c['cells']}",
            ]
        )
    header = [
        "kernel",
        f"subprocess {args.mb} MB, MB/s",
        "of it before idle",
        "os.write in cell, MB/s",
        "10 MB write, GIL held",
        "`pass` cell, ms to idle",
        "`os.write(1, b'x\\n')` cell, ms",
        "late",
    ]
    table = md_table(header, rows)
    ratios = []
    for n in names:
        if n != ref and ref in names:
            ratios.append(
                f"- {label(n)} / ipykernel: subprocess {mbps(thr[n]['sub']) / mbps(thr[ref]['sub']):.2f}x, "
                f"in-cell {mbps(thr[n]['inproc']) / mbps(thr[ref]['inproc']):.2f}x, "
                f"`pass` cell time {cells[n]['pass_ms'] / cells[ref]['pass_ms']:.2f}x"
            )
    text = (
        "## fd 1/2 output\n\n"
        + table
        + "\n\n"
        + "\n".join(ratios)
        + "\n\n"
        + prints_table(names, prints, args.prints, load)
    )
    print(text)
    write_json(
        pathlib.Path(args.json),
        {"throughput": thr, "cells": cells, "gil": gil, "prints": prints, "kernels": names, "load": load},
    )
    (RESULTS_DIR / "fdoutput.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
