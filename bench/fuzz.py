"""Long fuzz run: the fuzzer of tests/fuzzer.py against trikernel, ipykernel
and xeus-python, side by side (issue 17; figures in docs/robustness.md).

Per kernel: N messages (default 100,000), or as many as fit in
``--seconds``, across all five sockets in bursts of B (default 500), kinds
drawn by a seeded random.Random; ``long_subscription`` sends each of its
topics (1 KiB to 64 KiB) on a new IOPub connection, the last 20 kept open
(issue 26.1); the subshells made by valid create_subshell requests are
deleted past the last 20 (tests/fuzzer.py ``Peers``). After every
burst: is the process alive, does kernel_info on control answer within 5 s
(else: hung)? A dead or hung kernel is recorded with the kinds of the burst
that got it and restarted, and the run goes on; a hung one first gets its
thread stacks dumped (py-spy, if installed) and 30 s more to answer
(``answered_within_30s_more``: stuck, or only slow). Then the next burst
waits until the fuzzer's own shell and control requests have been served
(``Peers.wait_answered``; ``catch_up_max_s``): closed loop, so that the
kernel's RSS does not measure a backlog that grows from burst to burst. Reported: messages sent per
kind, bursts survived, deaths and hangs, RSS at start / max / end, kernel
log lines per 1,000 bad messages. With ``--breakdown``, at the end (after the
idle wait) a cell measures inside each IPython kernel what its RSS is made of
(bench/memory_breakdown.py: Python objects, pymalloc's free space, glibc's main
heap and thread arenas, code). Nothing is asserted.

Usage: python bench/fuzz.py [--messages 100000 | --seconds 300] [--burst 500] [--seed 17]
       [--kernels trikernel python3 xpython] [--breakdown] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
from jupyter_client.manager import KernelManager

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import memory_breakdown
from fuzzer import KINDS, Fuzzer, Peers, generate, load_connection, pick


class Target:
    def __init__(self, name: str, logdir: str):
        self.name = name
        self.logdir = logdir
        self.starts = 0
        self.log_lines = 0
        self.subshells_deleted = 0
        self.start()

    def start(self) -> None:
        self.starts += 1
        self.log_path = os.path.join(self.logdir, f"{self.name}-{self.starts}.log")
        self.log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 - the kernel writes it
        self.km = KernelManager(kernel_name=self.name)
        self.km.start_kernel(stderr=self.log, stdout=self.log)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.conn = load_connection(self.km.connection_file)
        self.fuzzer = Fuzzer(self.conn)
        self.peers = Peers(self.conn, fuzzer=self.fuzzer)  # it deletes subshells past 20 (tests/fuzzer.py)
        self.proc = psutil.Process(self.km.provisioner.pid)  # type: ignore[union-attr]

    def rss(self) -> int:
        try:
            return int(self.proc.memory_info().rss)
        except psutil.Error:
            return 0

    def peak(self) -> int:
        """The kernel process's peak RSS since it started (Linux VmHWM; 0
        elsewhere): what sampling after each burst misses, a large frame
        held for a moment inside a burst."""
        try:
            with open(f"/proc/{self.proc.pid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def answers(self, timeout: float) -> bool:
        msg = self.kc.session.msg("kernel_info_request")
        self.kc.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                r = self.kc.get_control_msg(timeout=max(0.05, deadline - time.monotonic()))
            except Exception:  # queue.Empty or a reader error: no answer
                return False
            if r["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return True
        return False

    def breakdown(self, timeout: float = 120.0) -> dict[str, Any] | None:
        """Run bench/memory_breakdown.py's cell in the kernel; its figures (MiB), or None
        when none came within ``timeout`` seconds (a kernel that is not IPython's)."""
        msg_id = self.kc.execute(memory_breakdown.CELL, store_history=False)
        text: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                m = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # queue.Empty: no answer in time
                break
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            if m["msg_type"] == "stream":
                text.append(m["content"]["text"])
            elif m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                break
        return memory_breakdown.parse("".join(text))

    def dump_stacks(self) -> str | None:
        """Every thread's stack of the kernel (``py-spy dump --native``) into the log
        directory; its path, or None without py-spy (``pip install py-spy``)."""
        spy = shutil.which("py-spy")
        if spy is None:
            return None
        path = f"{self.log_path[:-4]}-stacks-{time.strftime('%H%M%S')}.txt"
        with open(path, "w", encoding="utf-8") as f:
            subprocess.run([spy, "dump", "--native", "--pid", str(self.proc.pid)], stdout=f, stderr=f, timeout=60)
        return path

    def stop(self, graceful: bool = False) -> float | None:
        """Close the peers and end the kernel; ``graceful``: by shutdown_request, and return
        the seconds to the process's exit (None: not within 60 s, then killed)."""
        self.subshells_deleted += self.peers.subshells_deleted
        self.peers.close()
        took = None
        if graceful and self.km.is_alive():
            t0 = time.monotonic()
            self.kc.shutdown()
            try:
                self.proc.wait(60)
                took = time.monotonic() - t0
            except psutil.TimeoutExpired:
                pass
        self.kc.stop_channels()
        if self.km.is_alive():
            self.km.shutdown_kernel(now=True)
        self.log.close()
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            self.log_lines += sum(1 for _ in f)
        return took


def run_kernel(
    name: str,
    n: int,
    burst: int,
    seed: int,
    logdir: str,
    seconds: float | None = None,
    heavy: float = 0.01,
    only: tuple[str, ...] | None = None,
    breakdown: bool = False,
) -> dict[str, Any]:
    t = Target(name, logdir)
    stop_at = None if seconds is None else time.monotonic() + seconds
    rnd = random.Random(seed)
    kinds: Counter[str] = Counter()
    deaths: list[dict[str, Any]] = []
    rss0 = t.rss()
    rss_max = rss0
    peak = 0  # VmHWM, the highest of every kernel process of the run
    sent = bursts = survived = behind = 0
    catch_up_max = 0.0
    t0 = time.monotonic()
    while sent < n and (stop_at is None or time.monotonic() < stop_at):
        burst_kinds: Counter[str] = Counter()
        for _ in range(min(burst, n - sent)):
            kind, channel = pick(rnd, only, heavy_weight=heavy)
            t.peers.send(channel, generate(t.fuzzer, rnd, kind, channel))
            kinds[kind] += 1
            burst_kinds[kind] += 1
            sent += 1
        bursts += 1
        t.peers.drain(20)
        # what the new subscribers and the client's own SUB were sent: read, so that no
        # subscriber of the harness stalls the kernel's IOPub (it would wait for it
        # --iopub-send-timeout, and control's status messages with it, past the overdraft)
        for sock in (*t.peers.subscribers, t.kc.iopub_channel.socket):
            while sock.poll(0):
                sock.recv_multipart()
        alive = t.km.is_alive()
        ok = alive and t.answers(5.0)  # control, while the burst is still being served
        rss_max = max(rss_max, t.rss())
        if ok:
            # closed loop: the next burst once this one was served (tests/fuzzer.py
            # Peers.wait_answered), so RSS measures the input, not a growing backlog
            t0_catch = time.monotonic()
            if not t.peers.wait_answered(60.0):
                behind += 1
            catch_up_max = max(catch_up_max, time.monotonic() - t0_catch)
            rss_max = max(rss_max, t.rss())
            survived += 1
            continue
        how = "died" if not alive else "hung"
        death: dict[str, Any] = {"after_messages": sent, "how": how, "burst": dict(burst_kinds)}
        if alive:  # what it was doing, then whether it answers at all: stuck or only slow
            death["stacks"] = t.dump_stacks()
            death["answered_within_30s_more"] = t.answers(30.0)
        deaths.append(death)
        print(f"  {name}: {'died' if not alive else 'hung'} after {sent} messages", file=sys.stderr)
        peak = max(peak, t.peak())
        t.stop()
        t.start()
    elapsed = time.monotonic() - t0
    rss_end = t.rss()
    time.sleep(3.0)  # idle: trikernel's heap.py returns the rest of the last burst within 1 s
    rss_idle = t.rss()
    peak = max(peak, t.peak())
    parts = t.breakdown() if breakdown else None
    shutdown = t.stop(graceful=True)
    bad = sent - kinds["valid"]
    return {
        "kernel": name,
        "messages": sent,
        "seconds": round(elapsed, 1),
        "kinds": dict(sorted(kinds.items())),
        "bursts": bursts,
        "bursts_survived": survived,
        "deaths": deaths,
        "rss_start_mib": round(rss0 / 2**20, 1),
        "rss_max_mib": round(rss_max / 2**20, 1),
        "rss_end_mib": round(rss_end / 2**20, 1),
        "rss_idle_mib": round(rss_idle / 2**20, 1),
        "rss_peak_mib": round(peak / 2**20, 1) if peak else None,
        "shutdown_s": None if shutdown is None else round(shutdown, 2),
        "log_lines": t.log_lines,
        "subshells_deleted": t.subshells_deleted,
        "catch_up_max_s": round(catch_up_max, 2),
        "bursts_not_served_within_60s": behind,
        "log_lines_per_1000_bad": round(1000 * t.log_lines / max(1, bad), 2),
        "breakdown_mib": parts,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=None, help="run this long per kernel instead")
    ap.add_argument("--heavy-weight", type=float, default=0.01, help="weight of the huge kind (64 MiB frames)")
    ap.add_argument("--without", nargs="*", default=[], metavar="KIND", help="kinds not sent (e.g. valid huge)")
    ap.add_argument("--burst", type=int, default=500)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--kernels", nargs="+", default=["trikernel", "python3", "xpython"])
    ap.add_argument("--breakdown", action="store_true", help="measure what the RSS is made of at the end")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp(prefix="fuzz-ipython-"))
    logdir = tempfile.mkdtemp(prefix="fuzz-logs-")
    results = []
    for name in args.kernels:
        amount = f"{args.seconds:g} s" if args.seconds is not None else f"{args.messages} messages"
        print(f"fuzzing {name}: {amount}, bursts of {args.burst}, seed {args.seed}", file=sys.stderr)
        n = args.messages if args.seconds is None else 10**9
        kinds = tuple(k for k in KINDS if k not in args.without) if args.without else None
        r = run_kernel(name, n, args.burst, args.seed, logdir, args.seconds, args.heavy_weight, kinds, args.breakdown)
        results.append(r)
        print(json.dumps(r), flush=True)
    print(
        "\n| kernel | messages | s | bursts survived | deaths/hangs "
        "| RSS start/max/end/idle MiB | peak RSS (VmHWM) MiB | shutdown s | log lines per 1000 bad |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['kernel']} | {r['messages']} | {r['seconds']} | {r['bursts_survived']}/{r['bursts']} | "
            f"{len(r['deaths'])} | {r['rss_start_mib']}/{r['rss_max_mib']}/{r['rss_end_mib']}/{r['rss_idle_mib']} | "
            f"{r['rss_peak_mib']} | "
            f"{r['shutdown_s'] if r['shutdown_s'] is not None else '> 60'} | {r['log_lines_per_1000_bad']} |"
        )
    if args.breakdown:
        cols = ("rss", "file", "python_objects", "pymalloc_free", "main_heap", "thread_arenas", "other")
        print(f"\n| kernel (MiB, after the idle wait) | {' | '.join(cols)} |")
        print("|---" * (len(cols) + 1) + "|")
        for r in results:
            b = r["breakdown_mib"] or {}
            print(f"| {r['kernel']} | " + " | ".join(str(b.get(c, "-")) for c in cols) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(f"kernel logs: {logdir}", file=sys.stderr)


if __name__ == "__main__":
    main()
