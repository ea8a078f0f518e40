"""Run every bench in one go and write bench/results/latest.md (and the per-bench .json/.md).

Each bench runs in its own subprocess (iopub, startup, memory, fdoutput,
asyncio_cells, in that order) with a time limit; a bench that fails or times out is reported in
latest.md and the others still run. One full run takes about 6 minutes on
2 cores.

Usage: python bench/run_all.py [--quick] [--only iopub startup memory fdoutput]
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import RESULTS_DIR, machine, now_iso, versions

BENCH = pathlib.Path(__file__).resolve().parent
PLAN = {
    # comm_msg in adds ~5 x 3 trials of 2-10 s, and xeus-python's warm-up wait (10 s)
    "iopub": (["--reps", "5", "--burst-reps", "5"], 540),
    "startup": (["--reps", "10"], 300),
    "memory": ([], 240),
    "fdoutput": (["--reps", "3"], 360),
    "asyncio_cells": (["--requests", "300", "--reps", "7"], 300),
}
QUICK = {
    "iopub": [
        "--reps",
        "1",
        "--burst-reps",
        "1",
        "--comms",
        "2000",
        "--lines",
        "20000",
        "--comm-msgs",
        "500",
        "--buttons",
        "100",
    ],
    "startup": ["--reps", "2", "--crowd", "2x3"],
    "memory": ["--comms", "2000", "--stall", "3", "--idle-seconds", "1"],
    "fdoutput": ["--reps", "1", "--mb", "2", "--cells", "10", "--hang-timeout", "3"],
    "asyncio_cells": ["--requests", "20", "--reps", "1", "--awaits", "1000"],
}


def _tree_stamp() -> str:
    """Latest mtime under trikernel/ (catches edits git status alone would not tell apart)."""
    files = list((BENCH.parent / "trikernel").rglob("*.py"))
    return str(max((f.stat().st_mtime_ns for f in files), default=0))


def git_state() -> str:
    """Commit of the checkout and whether trikernel/ has uncommitted changes (read-only git calls)."""
    root = BENCH.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "trikernel", "kernelspec", "pyproject.toml"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"unknown ({exc})"
    return head + (f" + uncommitted changes in {len(dirty.splitlines())} file(s) under trikernel/" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, to check the harness (figures meaningless)")
    p.add_argument("--only", nargs="*", choices=list(PLAN), default=list(PLAN))
    p.add_argument("--out", default=str(RESULTS_DIR / "latest.md"))
    args = p.parse_args(argv)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    t_begin = time.monotonic()
    state_before = git_state() + " " + _tree_stamp()
    sections = []
    for name in args.only:
        extra, limit = PLAN[name]
        if args.quick:
            extra = QUICK[name]
        cmd = [sys.executable, str(BENCH / f"{name}.py"), *extra]
        print(f"== {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, check=False, stdout=subprocess.PIPE, text=True, timeout=limit)
            body = proc.stdout.strip()
            if proc.returncode != 0:
                body += f"\n\n**{name} bench exited with code {proc.returncode}** (see stderr of run_all)"
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            body = out.strip() + f"\n\n**{name} bench timed out after {limit} s**"
        sections.append(body)
        print(f"== {name}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    v = versions()
    header = [
        "# trikernel benchmarks (latest run)" + (" — QUICK MODE, figures meaningless" if args.quick else ""),
        "",
        f"- date: {now_iso()}",
        f"- machine: {machine()}",
        f"- trikernel checkout: {state_before.rsplit(' ', 1)[0]}"
        + (
            ""
            if state_before == git_state() + " " + _tree_stamp()
            else " — **trikernel/ CHANGED during the run: figures mix versions, run again**"
        ),
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        "- all traffic on loopback (127.0.0.1); kernels started by jupyter_client in subprocesses",
        f"- total wall time: {time.monotonic() - t_begin:.0f} s",
        "",
    ]
    text = "\n".join(header) + "\n" + "\n\n".join(sections) + "\n"
    pathlib.Path(args.out).write_text(text)
    print(text)
    print(f"written: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
