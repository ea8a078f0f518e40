"""Kernel memory (RSS, psutil): idle, and growth during a flood while one subscriber stalls.

Per kernel (fresh kernel each, classic start, plain TCP):

1. idle: after start-up and one trivial cell, wait 1 s, then RSS and the
   kernel's CPU use over ``--idle-seconds`` of doing nothing (a busy-polling
   io loop would show here).
2. stalled subscriber: a second raw SUB socket connects to IOPub,
   subscribes, and does not read for ``--stall`` (10) seconds, while the
   normal client (jupyter_client's iopub socket) reads everything and a
   cell floods ``N`` (20000) comm_open messages of ~1 KB each
   (``comm.create_comm(target_name="bench", data={"pad": "x" * 1000})``).
   RSS is sampled every ~50 ms from the execute until the stall ends; the
   stalled socket then drains what it got. Reported: RSS before, peak,
   growth (peak - before), RSS 1 s after the stall, what the reading
   client and the stalled one received, and the cell's time to idle.

The kernel log lines about waits / fallback drops are quoted. Nothing is
asserted.

Usage: python bench/memory.py [--kernels ...] [--comms 20000] [--stall 10]
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import time
from typing import Any

import psutil
import zmq

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import (
    DELIM,
    RESULTS_DIR,
    available_kernels,
    fmt,
    kernel,
    label,
    md_table,
    quick_exec,
    ratio,
    run_cell,
    write_json,
)

SETUP = "import comm\n_bench_pad = 'x' * 1000\n_bench_comms = []"
FLOOD = "_bench_comms.append([comm.create_comm(target_name='bench', data={{'pad': _bench_pad}}) for _ in range({n})])"
LOG_PATTERN = re.compile(r"(?i)\b(fallback|stalled|drops?|dropped|dropping|not reading|waited)\b")
MB = 1024 * 1024


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _rss(proc: psutil.Process) -> int:
    return proc.memory_info().rss


def _flood(k: Any, n: int, stall: float | None) -> dict[str, Any]:
    """Run the flood cell in kernel ``k``; with ``stall``, a second SUB does not read for that long."""
    out: dict[str, Any] = {}
    proc = psutil.Process(k.pid)
    quick_exec(k.kc, SETUP)
    stalled: zmq.Socket[bytes] | None = None
    if stall:
        info = k.km.get_connection_info()
        stalled = zmq.Context.instance().socket(zmq.SUB)
        stalled.setsockopt(zmq.LINGER, 0)
        stalled.setsockopt(zmq.SUBSCRIBE, b"")
        stalled.connect(f"tcp://{info['ip']}:{info['iopub_port']}")
        time.sleep(0.5)  # let the subscription reach the kernel's XPUB
        while stalled.poll(100):  # only the welcome (if any); the flood comes next
            stalled.recv_multipart()
    time.sleep(0.5)
    out["rss_before"] = rss_before = _rss(proc)
    samples: list[tuple[float, int]] = []
    t0 = time.perf_counter()

    def sample() -> None:
        samples.append((time.perf_counter() - t0, _rss(proc)))

    run = run_cell(k.kc, FLOOD.format(n=n), timeout=(stall or 0) + 120, on_poll=sample, poll_ms=50)
    while time.perf_counter() - t0 < (stall or 0):
        sample()
        time.sleep(0.05)
    sample()
    if stalled is not None:
        # the stalled subscriber wakes up and drains what it was given
        got = 0
        while stalled.poll(500):
            frames = stalled.recv_multipart()
            parts = frames[frames.index(DELIM) + 1 :]
            if b'"comm_open"' in parts[1]:
                got += 1
        stalled.close(0)
        out["stalled_received"] = got
    time.sleep(1.0)
    out["rss_after"] = _rss(proc)
    out["rss_peak"] = peak = max((r for _, r in samples), default=rss_before)
    out["growth"] = peak - rss_before
    out["samples"] = samples
    out["cell"] = run.as_dict()
    out["reader_received"] = run.counts.get("comm_open", 0)
    out["log_lines"] = [ln for ln in k.log_tail(400).splitlines() if LOG_PATTERN.search(ln)][:8]
    return out


def measure(name: str, n: int, stall: float, idle_seconds: float) -> dict[str, Any]:
    """Kernel A: idle figures, then the flood with no stalled subscriber (control).
    Kernel B (fresh): the flood with the stalled subscriber."""
    out: dict[str, Any] = {"kernel": name}
    with kernel(name, log_tag="-memory-control") as k:
        proc = psutil.Process(k.pid)
        quick_exec(k.kc, "1+1")
        time.sleep(1.0)
        out["rss_idle"] = _rss(proc)
        c0 = proc.cpu_times()
        time.sleep(idle_seconds)
        c1 = proc.cpu_times()
        out["idle_cpu_pct"] = 100 * ((c1.user + c1.system) - (c0.user + c0.system)) / idle_seconds
        out["threads"] = proc.num_threads()
        out["control"] = _flood(k, n, None)
    with kernel(name, log_tag="-memory-stalled") as k:
        out["stalled"] = _flood(k, n, stall)
    c, s = out["control"], out["stalled"]
    out["stall_extra"] = s["growth"] - c["growth"]
    _log(
        f"[memory] {label(name):12} idle {out['rss_idle'] / MB:.1f} MiB, cpu {out['idle_cpu_pct']:.1f}%; "
        f"control flood +{c['growth'] / MB:.1f} MiB ({c['cell']['elapsed']:.2f}s, reader {c['reader_received']}/{n}); "
        f"stalled flood +{s['growth'] / MB:.1f} MiB ({s['cell']['elapsed']:.2f}s, reader {s['reader_received']}/{n}, "
        f"stalled sub {s['stalled_received']}/{n}) {s['cell']['note']}"
    )
    return out


def report(res: list[dict[str, Any]], n: int, stall: float) -> str:
    by = {r["kernel"]: r for r in res if "error" not in r}
    tri, ipk = by.get("trikernel"), by.get("python3")

    def mb(x: Any) -> str:
        return fmt(x / MB, 1) if isinstance(x, (int, float)) else "n/a"

    def idle_s(c: dict[str, Any]) -> str:
        return fmt(c["elapsed"], 2) + ("" if c["got_idle"] else " (NO idle)")

    rows = []
    for r in res:
        if "error" in r:
            rows.append([label(r["kernel"]), "error: " + r["error"]] + [""] * 9)
            continue
        c, s = r["control"], r["stalled"]
        rows.append(
            [
                label(r["kernel"]),
                mb(r["rss_idle"]),
                fmt(r["idle_cpu_pct"], 1),
                f"+{mb(c['growth'])}",
                f"+{mb(s['growth'])}",
                mb(r["stall_extra"]),
                mb(s["rss_peak"]),
                f"{c['reader_received']}/{n}, {s['reader_received']}/{n}",
                f"{s['stalled_received']}/{n}",
                idle_s(c["cell"]),
                idle_s(s["cell"]),
            ]
        )
    if tri and ipk:
        rows.append(
            [
                "trikernel / ipykernel",
                ratio(tri["rss_idle"], ipk["rss_idle"]),
                "",
                ratio(tri["control"]["growth"], ipk["control"]["growth"]),
                ratio(tri["stalled"]["growth"], ipk["stalled"]["growth"]),
                "",
                ratio(tri["stalled"]["rss_peak"], ipk["stalled"]["rss_peak"]),
                "",
                "",
                "",
                "",
            ]
        )
    table = md_table(
        [
            "kernel",
            "idle RSS MiB",
            "idle CPU %",
            "flood growth MiB, all reading",
            f"flood growth MiB, 1 sub stalled {stall:.0f}s",
            "extra growth from the stall MiB",
            "peak RSS MiB (stalled run)",
            "reader got (all reading, stalled run)",
            "stalled sub got",
            "s to idle, all reading",
            "s to idle, stalled run",
        ],
        rows,
    )
    parts = [
        "### Memory",
        "",
        (
            f"Flood: one cell creating {n} comms with a ~1 KB payload each (`{FLOOD.format(n=n)}`), "
            "once with every subscriber reading (control, same kernel as the idle figures) and once in a fresh "
            f"kernel while a second SUB socket subscribes and does not read for {stall:.0f} s (the jupyter_client "
            "reader keeps reading). Growth = peak RSS during the flood (sampled every ~50 ms until the stall "
            "ended) minus RSS just before; it includes the comm objects the cell keeps, hence the control column."
        ),
        "",
        table,
    ]
    for r in res:
        lines = r.get("stalled", {}).get("log_lines") if "error" not in r else None
        if lines:
            parts += ["", f"{label(r['kernel'])} kernel log during the stalled run:", "", "```", *lines, "```"]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", nargs="*", default=None)
    p.add_argument("--comms", type=int, default=20000)
    p.add_argument("--stall", type=float, default=10.0)
    p.add_argument("--idle-seconds", type=float, default=3.0)
    p.add_argument("--json", default=str(RESULTS_DIR / "memory.json"))
    p.add_argument("--md", default=str(RESULTS_DIR / "memory.md"))
    args = p.parse_args(argv)
    t0 = time.monotonic()
    res = []
    for name in available_kernels(args.kernels):
        try:
            res.append(measure(name, args.comms, args.stall, args.idle_seconds))
        except Exception as exc:  # a bench reports any failure and goes on
            _log(f"[memory] {name}: FAILED {exc!r}")
            res.append({"kernel": name, "error": repr(exc)})
    text = report(res, args.comms, args.stall)
    text += f"\n\n(memory bench wall time {time.monotonic() - t0:.0f} s)\n"
    write_json(pathlib.Path(args.json), res)
    pathlib.Path(args.md).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
