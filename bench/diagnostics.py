"""What ``--strict`` and ``--message-log`` cost (issue 14, part 2), trikernel beside itself.

Variants, each a copy of the installed ``trikernel`` kernelspec in a
temporary JUPYTER_PATH with flags added to its argv:

- ``off``: as installed (both aids off);
- ``strict``: ``--strict``;
- ``log``: ``--message-log <tmp>/log-<n>.jsonl``;
- ``strict+log``: both;
- ``base`` (only with ``--baseline SRC``): ``off`` with ``PYTHONPATH=SRC``,
  another checkout of trikernel (e.g. ``git archive main``), to show that
  the aids cost nothing when off.

Measured:

1. the execute round trip of ``bench/latency.py`` (its raw pyzmq client:
   ``execute_request`` of ``pass`` → ``execute_reply``, and → ``idle``),
   ``--requests`` rounds interleaved across variants after 20 warm-up
   rounds; medians and p99;
2. IOPub throughput, ``bench/iopub.py``'s comm and stream cells
   (``--comms`` comm_open, ``--lines`` prints), ``--reps`` interleaved
   trials, for ``off``, ``log`` (and ``base``); the log's own counters
   (lines, dropped) are read from its ``closed`` line;
3. the check alone: ``trikernel.msgspec.validate_message`` per message type,
   in process (µs per call).

Figures are reported, never asserted. Usage:
python bench/diagnostics.py [--requests 300] [--reps 3] [--comms 20000] [--lines 200000] [--baseline SRC]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import timeit
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import iopub
import latency
from _common import RESULTS_DIR, fmt, machine, md_table, median, now_iso, start_kernel, write_json
from jupyter_client.kernelspec import KernelSpecManager


def make_variants(root: Path, baseline: str | None) -> dict[str, Path]:
    """Kernelspecs ``tk-<variant>`` under ``root``; returns variant -> its log file (or none)."""
    src = Path(KernelSpecManager().get_kernel_spec("trikernel").resource_dir)
    spec = json.loads((src / "kernel.json").read_text())
    spec["kernel_protocol_version"] = "5.5"  # started the classic way, as bench/latency.py does
    logs: dict[str, Path] = {}
    variants: dict[str, tuple[list[str], dict[str, str]]] = {
        "off": ([], {}),
        "strict": (["--strict"], {}),
        "log": (["--message-log", str(root / "log-log.jsonl")], {}),
        "strict+log": (["--strict", "--message-log", str(root / "log-strict+log.jsonl")], {}),
    }
    if baseline:
        variants["base"] = ([], {"PYTHONPATH": baseline})
    for name, (extra, env) in variants.items():
        d = root / "kernels" / f"tk-{name}"
        shutil.copytree(src, d)
        s = dict(spec, argv=[*spec["argv"], *extra], display_name=f"trikernel {name}")
        if env:
            s["env"] = env
        (d / "kernel.json").write_text(json.dumps(s, indent=1))
        if "--message-log" in extra:
            logs[name] = Path(extra[extra.index("--message-log") + 1])
    return logs


def bench_round_trips(variants: list[str], requests: int) -> dict[str, dict[str, dict[str, float]]]:
    kernels = {v: start_kernel(f"tk-{v}", log_tag="-diag") for v in variants}
    clients = {v: latency.RawClient(k.km.get_connection_info()) for v, k in kernels.items()}
    rows: dict[str, dict[str, list[float]]] = {v: {"execute reply": [], "execute idle": []} for v in variants}
    try:
        for _ in range(20):
            for c in clients.values():
                latency.one_execute(c)
        for _ in range(requests):
            for v, c in clients.items():
                r, i = latency.one_execute(c)
                rows[v]["execute reply"].append(r)
                rows[v]["execute idle"].append(i)
    finally:
        for c in clients.values():
            c.close()
        for k in kernels.values():
            k.shutdown()
    return {v: {row: latency.stats(xs) for row, xs in r.items()} for v, r in rows.items()}


def validation_cost() -> dict[str, float]:
    """µs per validate_message call for typical client messages (in process)."""
    from trikernel.protocol import msgspec

    header = {
        "msg_id": "a_1",
        "username": "u",
        "session": "s",
        "date": datetime.now(UTC).isoformat(),
        "version": "5.5",
    }
    samples = {
        "execute_request": {
            "code": "pass",
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
        },
        "complete_request": {"code": "import o", "cursor_pos": 8},
        "kernel_info_request": {},
        "comm_msg": {"comm_id": "c", "data": {"method": "update", "state": {"value": 1}}},
        "input_reply": {"value": "x"},
    }
    channels = {"comm_msg": "shell", "input_reply": "stdin", "kernel_info_request": "control"}
    out = {}
    for msg_type, content in samples.items():
        msg = {"header": {**header, "msg_type": msg_type}, "parent_header": {}, "metadata": {}, "content": content}
        ch = channels.get(msg_type, "shell")
        assert msgspec.validate_message(msg, channel=ch, sender="client") == []
        n = 2000
        t = timeit.timeit(lambda: msgspec.validate_message(msg, channel=ch, sender="client"), number=n)  # noqa: B023
        out[msg_type] = t / n * 1e6
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--comms", type=int, default=20000)
    ap.add_argument("--lines", type=int, default=200000)
    ap.add_argument("--baseline", default=None, help="a checkout of trikernel to compare 'off' against")
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--no-round-trips", action="store_true")
    ap.add_argument("--json", default=str(RESULTS_DIR / "diagnostics.json"))
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-diag-"))
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(root) + (os.pathsep + old if old else "")
    logs = make_variants(root, args.baseline)
    result: dict[str, Any] = {"machine": machine(), "date": now_iso()}
    try:
        variants = (["base"] if args.baseline else []) + ["off", "strict", "log", "strict+log"]
        rt = {} if args.no_round_trips else bench_round_trips(variants, args.requests)
        result["round_trips"] = rt
        ref = "base" if args.baseline else "off"
        table = []
        for v in variants if rt else []:
            r, i = rt[v]["execute reply"], rt[v]["execute idle"]
            table.append(
                [
                    v,
                    f"{fmt(r['median_ms'], 3)} / {fmt(r['p99_ms'], 3)}",
                    f"{(r['median_ms'] - rt[ref]['execute reply']['median_ms']) * 1000:+.0f} µs",
                    f"{fmt(i['median_ms'], 3)} / {fmt(i['p99_ms'], 3)}",
                    f"{(i['median_ms'] - rt[ref]['execute idle']['median_ms']) * 1000:+.0f} µs",
                ]
            )
        text = f"# --strict / --message-log ({now_iso()}, {machine()})\n\n"
        text += f"## execute round trip ({args.requests} interleaved rounds)\n\n"
        text += md_table(
            ["variant", "→ reply, median / p99 ms", f"vs {ref}", "→ idle, median / p99 ms", f"vs {ref}"], table
        )
        if not args.no_throughput:
            tv = (["base"] if args.baseline else []) + ["off", "log"]
            thr = iopub.bench_throughput([f"tk-{v}" for v in tv], args.reps, args.comms, args.lines)
            result["throughput"] = thr
            ttable = []
            for v in tv:
                t = thr[f"tk-{v}"]
                comm = [r for r in t["comm"] if r["got_idle"]]
                stream = [r for r in t["stream"] if r["got_idle"]]
                rates = [r["counts"].get("comm_open", 0) / r["elapsed"] for r in comm]
                mbs = [r["stream_bytes"] / r["elapsed"] / 1e6 for r in stream]
                # kernel CPU (all its threads, psutil) per message: steadier than wall time on a shared machine
                cpu_msg = [
                    r["kernel_cpu"] / max(1, r["counts"].get("comm_open", 0)) * 1e6
                    for r in comm
                    if r.get("kernel_cpu") is not None
                ]
                cpu_mb = [
                    r["kernel_cpu"] / (r["stream_bytes"] / 1e6) * 1e3
                    for r in stream
                    if r.get("kernel_cpu") is not None and r["stream_bytes"]
                ]
                ttable.append(
                    [
                        v,
                        f"{median(rates):,.0f}",
                        f"{median(cpu_msg):.1f}",
                        f"{median(mbs):.2f}",
                        f"{median(cpu_mb):.1f}",
                        "; ".join(t["errors"]) or "-",
                    ]
                )
            text += f"\n\n## IOPub throughput (median of {args.reps})\n\n"
            text += md_table(
                [
                    "variant",
                    "comm_open msg/s",
                    "kernel CPU µs / comm_open",
                    "stream MB/s",
                    "kernel CPU ms / MB",
                    "errors",
                ],
                ttable,
            )
        lt = []
        for v, path in logs.items():
            if path.exists():
                closed = [json.loads(line) for line in path.read_text().splitlines() if '"event":"closed"' in line]
                lt.append(
                    [
                        v,
                        str(sum(c["lines"] for c in closed)),
                        str(sum(c["dropped"] for c in closed)),
                        f"{path.stat().st_size / 1e6:.1f} MB",
                    ]
                )
        text += "\n\n## message log files\n\n" + md_table(["variant", "lines", "dropped", "size"], lt)
        vc = validation_cost()
        result["validate_us"] = vc
        text += "\n\n## the check alone (trikernel.msgspec.validate_message, in process)\n\n"
        text += md_table(["message", "µs / call"], [[k, f"{v:.0f}"] for k, v in vc.items()])
        print(text)
        write_json(Path(args.json), result)
        (RESULTS_DIR / "diagnostics.md").write_text(text + "\n")
    finally:
        if old is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = old
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
