"""IOPub subscription floods (issue 26.1): trikernel beside ipykernel.

A SUB socket needs no key. Two floods, against a fresh kernel each:

- ``long``: N SUB sockets each subscribe a random 64 KiB topic, stay 2 s,
  then close (libzmq keeps each topic in its subscription tree and walks the
  whole tree on the socket owner's thread whenever a subscriber leaves);
- ``distinct``: one SUB subscribes M distinct 1 KiB topics (each within the
  bound), then a plain ``b""`` subscriber comes and closes: the hole that
  no MAXMSGSIZE closes (docs/robustness.md, "IOPub subscriptions").

Measured throughout: kernel_info on control, one request at a time, a new
one every 50 ms, each latency recorded (a stall shows as one long one);
the kernel's RSS and CPU (psutil, every 0.25 s); then shutdown_request →
process exit. "silent > X s" means no reply came within the recovery
window. Nothing is asserted.

Usage: python bench/subscriptions.py [--subs 500] [--ipykernel-subs 50]
       [--distinct 5000] [--kernels trikernel python3] [--recovery 120]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

import psutil
import zmq
from _common import RESULTS_DIR, label, machine, md_table, now_iso, start_kernel, versions, write_json
from jupyter_client.session import Session

LONG = 1 << 16


class ControlPoller(threading.Thread):
    """kernel_info on control every ``period`` s, one at a time; records (sent at, latency).
    Its own Session: jupyter_client uses the session id as the DEALER identity."""

    def __init__(self, km: Any, period: float = 0.05):
        super().__init__(daemon=True)
        session = Session(key=km.session.key, signature_scheme=km.session.signature_scheme)
        self.kc = km.client(session=session)
        self.kc.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
        self.period = period
        self.samples: list[tuple[float, float]] = []
        self.pending_since: float | None = None
        self.halt = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.halt.is_set():
            msg = self.kc.session.msg("kernel_info_request", {})
            sent = time.monotonic()
            self.pending_since = sent
            self.kc.control_channel.send(msg)
            latency = float("inf")
            while not self.halt.is_set():
                try:
                    r = self.kc.control_channel.get_msg(timeout=0.5)
                except Exception:  # queue.Empty: still waiting
                    continue
                if r["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                    latency = time.monotonic() - sent
                    break
            self.pending_since = None
            self.samples.append((sent - self.t0, latency))
            time.sleep(max(0.0, self.period - (time.monotonic() - sent)))
        self.kc.stop_channels()

    def stalled_for(self) -> float:
        since = self.pending_since
        return 0.0 if since is None else time.monotonic() - since


class Sampler(threading.Thread):
    def __init__(self, proc: psutil.Process):
        super().__init__(daemon=True)
        self.proc = proc
        self.rss: list[int] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.rss.append(self.proc.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.25)


def _sub(ctx: zmq.Context[Any], url: str, *topics: bytes, sndhwm: int | None = None) -> zmq.Socket[Any]:
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.LINGER, 0)
    if sndhwm is not None:
        s.setsockopt(zmq.SNDHWM, sndhwm)  # a SUB's default 1000 drops subscriptions past it
    s.connect(url)
    for t in topics:
        s.setsockopt(zmq.SUBSCRIBE, t)
    return s


def flood_long(ctx: zmq.Context[Any], url: str, n: int) -> None:
    socks = [_sub(ctx, url, os.urandom(LONG)) for _ in range(n)]
    time.sleep(2.0)  # they stay a while: a live subscriber's topics stay in the tree meanwhile
    for s in socks:
        s.close()


def flood_distinct(ctx: zmq.Context[Any], url: str, m: int) -> None:
    s = _sub(ctx, url, sndhwm=0)
    time.sleep(0.3)  # connected first: subscriptions queued before the handshake are dropped by libzmq's SUB
    for _ in range(m):
        s.setsockopt(zmq.SUBSCRIBE, os.urandom(1024))
    time.sleep(2.0)
    plain = _sub(ctx, url, b"")
    plain.poll(10_000)  # its welcome (trikernel; ipykernel sends one to the first subscriber only)
    plain.close()  # this close walks the whole tree
    time.sleep(1.0)
    s.close()


def run(kernel_name: str, scenario: str, size: int, recovery: float) -> dict[str, Any]:
    k = start_kernel(kernel_name, log_tag=f"-subs-{scenario}-{size}")
    try:
        pid = k.pid
        assert pid is not None
        proc = psutil.Process(pid)
        info = k.km.get_connection_info()
        url = f"tcp://{info['ip']}:{info['iopub_port']}"
        time.sleep(1.0)
        rss0 = proc.memory_info().rss
        cpu0 = sum(proc.cpu_times()[:2])
        poller, sampler = ControlPoller(k.km), Sampler(proc)
        poller.start()
        sampler.start()
        time.sleep(1.0)
        ctx = zmq.Context()
        started = time.monotonic() - poller.t0
        (flood_long if scenario == "long" else flood_distinct)(ctx, url, size)
        ctx.destroy(linger=0)
        ended = time.monotonic() - poller.t0
        # recovered: 3 s of replies all within 100 ms after the flood, or the window ran out
        deadline = time.monotonic() + recovery
        while time.monotonic() < deadline:
            time.sleep(0.5)
            now = time.monotonic() - poller.t0
            recent = [lat for at, lat in poller.samples if at > max(ended, now - 3.0)]
            if len(recent) >= 30 and max(recent) < 0.1 and poller.stalled_for() < 0.1:
                break
        silent = poller.stalled_for()
        poller.halt.set()
        sampler.halt.set()
        poller.join(5)
        sampler.join(5)
        rss1 = proc.memory_info().rss
        cpu1 = sum(proc.cpu_times()[:2])
        lats = [lat for at, lat in poller.samples if at >= started - 0.5]
        if silent > 0.1:
            lats.append(silent)  # the request still unanswered when the window closed
        sd0 = time.monotonic()
        k.kc.shutdown()
        try:
            proc.wait(timeout=60)
            shutdown: float | None = time.monotonic() - sd0
        except psutil.TimeoutExpired:
            shutdown = None
        return {
            "kernel": kernel_name,
            "scenario": scenario,
            "size": size,
            "control_requests": len(lats),
            "control_worst_s": max(lats, default=float("nan")),
            "control_over_100ms": sum(1 for x in lats if x > 0.1),
            "unanswered_at_end_s": silent if silent > 0.1 else 0.0,
            "kernel_cpu_s": cpu1 - cpu0,
            "rss_start_mib": rss0 / 2**20,
            "rss_peak_mib": max(sampler.rss, default=rss1) / 2**20,
            "rss_end_mib": rss1 / 2**20,
            "shutdown_s": shutdown,
        }
    finally:
        k.shutdown()


def _row(r: dict[str, Any], recovery: float) -> list[str]:
    worst = r["control_worst_s"]
    shown = f"silent > {recovery:.0f} s" if r["unanswered_at_end_s"] else f"{worst * 1000:,.0f} ms"
    what = f"{r['size']} x 64 KiB, closed" if r["scenario"] == "long" else f"{r['size']} x 1 KiB on one SUB"
    sd = "> 60 s" if r["shutdown_s"] is None else f"{r['shutdown_s']:.2f} s"
    return [
        label(r["kernel"]),
        what,
        shown,
        f"{r['control_over_100ms']} / {r['control_requests']}",
        f"{r['kernel_cpu_s']:.1f}",
        f"{r['rss_start_mib']:.0f} / {r['rss_peak_mib']:.0f} / {r['rss_end_mib']:.0f}",
        sd,
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", nargs="+", default=["trikernel", "python3"])
    ap.add_argument("--subs", type=int, default=500, help="long-topic subscribers against trikernel")
    ap.add_argument("--ipykernel-subs", type=int, default=50, help="against the others (500 would stall for ages)")
    ap.add_argument("--distinct", type=int, default=5000, help="distinct 1 KiB topics on one SUB")
    ap.add_argument("--recovery", type=float, default=120.0, help="s to wait for control to answer again")
    a = ap.parse_args()
    results = []
    for name in a.kernels:
        plan = [("long", a.subs if name == "trikernel" else a.ipykernel_subs), ("distinct", a.distinct)]
        if name == "trikernel" and a.subs != a.ipykernel_subs:
            plan.insert(0, ("long", a.ipykernel_subs))
        for scenario, size in plan:
            print(f"{label(name)}: {scenario} {size}", file=sys.stderr, flush=True)
            r = run(name, scenario, size, a.recovery)
            print(r, file=sys.stderr, flush=True)
            results.append(r)
    table = md_table(
        ["kernel", "flood", "control worst", "over 100 ms", "kernel CPU s", "RSS MiB start / peak / end", "shutdown"],
        [_row(r, a.recovery) for r in results],
    )
    text = f"# IOPub subscription floods\n\n{now_iso()}, {machine()}\n\n{versions()}\n\n{table}\n"
    print(text)
    (RESULTS_DIR / "subscriptions.md").parent.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "subscriptions.md").write_text(text)
    write_json(RESULTS_DIR / "subscriptions.json", results)


if __name__ == "__main__":
    main()
