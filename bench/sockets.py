"""Socket drivers in a ping-pong: CPU per 10,000 round trips, TrioSocket next to zmq-anyio.

A server process binds a ROUTER on loopback and echoes every message it
reads, driven by one of:

- ``TrioSocket``: trikernel's adapter (``await recv_multipart()``,
  ``send_nowait()``), in a trio run;
- ``zmq-anyio``: ``zmq_anyio.Socket`` in a trio run (``await
  arecv_multipart()``, ``send_multipart()``);
- ``zmq-anyio/asend``: the same with ``await asend_multipart()``, as
  trikernel's first version used it;
- ``pyzmq-blocking``: blocking pyzmq calls, no event loop (the floor: what
  libzmq and pyzmq cost alone).

The client (this process) is a blocking DEALER that sends one message and
waits for its echo, ``--round-trips`` times per trial. Between its ``start``
and ``stop`` messages the server measures its own CPU (getrusage: the trio
thread plus libzmq's I/O thread), the CPU of the thread that drives the
socket (``time.thread_time``), and, in a trio run, the tasks spawned (a
trio Instrument). Each trial runs every driver in a fresh server process;
trials are interleaved and the median is reported, with the ratio to
TrioSocket. Nothing is asserted.

Usage: python bench/sockets.py [--round-trips 10000] [--reps 3] [--drivers ...]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import subprocess
import sys
import time
from typing import Any

import zmq

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import RESULTS_DIR, fmt, machine, md_table, median, now_iso, versions, write_json

DRIVERS = ("TrioSocket", "zmq-anyio", "zmq-anyio/asend", "pyzmq-blocking")
WARMUP = 200


# ----------------------------------------------------------------- server side


class _Meter:
    """CPU and task counts between the client's ``start`` and ``stop``."""

    def __init__(self) -> None:
        self.spawned = 0
        self._t0: tuple[float, float, int] | None = None
        self.result: dict[str, Any] = {}

    def task_spawned(self, task: object) -> None:  # trio Instrument hook
        self.spawned += 1

    @staticmethod
    def _cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def start(self) -> None:
        self._t0 = (self._cpu(), time.thread_time(), self.spawned)

    def stop(self, round_trips: int) -> None:
        assert self._t0 is not None
        cpu0, thread0, spawned0 = self._t0
        self.result = {
            "round_trips": round_trips,
            "process_cpu": self._cpu() - cpu0,
            "thread_cpu": time.thread_time() - thread0,
            "tasks_spawned": self.spawned - spawned0,
        }


def _echo_step(meter: _Meter, frames: list[bytes], state: dict[str, int]) -> bool:
    """Book-keeping for one message; False once the client said stop."""
    body = frames[-1]
    if body == b"start":
        meter.start()
        state["n"] = 0
    elif body == b"stop":
        meter.stop(state["n"])
        return False
    else:
        state["n"] += 1
    return True


def serve(driver: str) -> None:
    """Server process: bind, print the port, echo until ``stop``, print the figures."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    print(port, flush=True)
    meter = _Meter()
    state = {"n": 0}
    if driver == "pyzmq-blocking":
        while True:
            frames = router.recv_multipart()
            go = _echo_step(meter, frames, state)
            router.send_multipart(frames)
            if not go:
                break
    else:
        import trio

        trio.run(_serve_trio, driver, router, meter, state, instruments=[meter])  # type: ignore[list-item]
    print(json.dumps(meter.result), flush=True)
    ctx.destroy(linger=0)


async def _serve_trio(driver: str, router: zmq.Socket[Any], meter: _Meter, state: dict[str, int]) -> None:
    if driver == "TrioSocket":
        from trikernel.server.sockets import TrioSocket

        ts = TrioSocket(router, "bench")
        while True:
            frames = await ts.recv_multipart()
            go = _echo_step(meter, frames, state)
            ts.send_nowait(frames)
            if not go:
                return
    import zmq_anyio

    asend = driver == "zmq-anyio/asend"
    async with zmq_anyio.Socket(router) as s:
        while True:
            got = await s.arecv_multipart()
            go = _echo_step(meter, got, state)  # type: ignore[arg-type]
            if asend:
                await s.asend_multipart(got)  # type: ignore[arg-type]
            else:
                s.send_multipart(got)  # type: ignore[no-untyped-call]
            if not go:
                return


# ----------------------------------------------------------------- client side


def trial(driver: str, round_trips: int) -> dict[str, Any]:
    """One server process for ``driver``; returns its figures and the client's wall time."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", driver],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(pathlib.Path(__file__).resolve().parent.parent),
    )
    assert proc.stdout is not None
    ctx = zmq.Context()
    try:
        port = int(proc.stdout.readline())
        d = ctx.socket(zmq.DEALER)
        d.linger = 0
        d.rcvtimeo = 30_000
        d.connect(f"tcp://127.0.0.1:{port}")
        for _ in range(WARMUP):
            d.send(b"warm")
            d.recv()
        d.send(b"start")
        d.recv()
        msg = b"x" * 64
        t0 = time.perf_counter()
        for _ in range(round_trips):
            d.send(msg)
            d.recv()
        wall = time.perf_counter() - t0
        d.send(b"stop")
        d.recv()
        out: dict[str, Any] = json.loads(proc.stdout.readline())
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ctx.destroy(linger=0)
    assert out["round_trips"] == round_trips, out
    out["wall"] = wall
    out["driver"] = driver
    return out


def report(trials: list[dict[str, Any]], drivers: list[str], round_trips: int) -> str:
    per10k = 10_000 / round_trips

    def med(d: str, key: str) -> float:
        return median([t[key] for t in trials if t["driver"] == d and "error" not in t])

    base = med("TrioSocket", "process_cpu") if "TrioSocket" in drivers else float("nan")
    base_thread = med("TrioSocket", "thread_cpu") if "TrioSocket" in drivers else float("nan")
    rows = []
    for d in drivers:
        cpu, thread = med(d, "process_cpu"), med(d, "thread_cpu")
        tasks = med(d, "tasks_spawned") / round_trips
        rows.append(
            [
                d,
                fmt(cpu * per10k),
                f"{cpu / base:.2f}x" if base == base else "n/a",
                fmt(thread * per10k),
                f"{thread / base_thread:.2f}x" if base_thread == base_thread else "n/a",
                fmt(tasks, 1) if d != "pyzmq-blocking" else "-",
                fmt(med(d, "wall") / round_trips * 1e6, 0),
            ]
        )
    errors = [t for t in trials if "error" in t]
    v = versions()
    try:
        import importlib.metadata as md

        v["zmq-anyio"] = md.version("zmq-anyio")
        v["anyio"] = md.version("anyio")
    except Exception:  # versions are informative
        pass
    lines = [
        f"# Socket drivers: ping-pong CPU ({now_iso()})",
        "",
        f"{machine()}; " + ", ".join(f"{k} {x}" for k, x in v.items()),
        "",
        f"{round_trips} round trips per trial, 64-byte message, TCP loopback, median of "
        f"{len(trials) // max(len(drivers), 1)} trials. Server CPU per 10,000 round trips: the whole "
        "server process (driving thread + libzmq I/O thread), and the driving thread alone.",
        "",
        md_table(
            [
                "driver",
                "process CPU s / 10k",
                "vs TrioSocket",
                "thread CPU s / 10k",
                "vs TrioSocket",
                "tasks spawned / round trip",
                "wall µs / round trip",
            ],
            rows,
        ),
    ]
    if errors:
        lines += ["", "Failed trials: " + "; ".join(f"{t['driver']}: {t['error']}" for t in errors)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", choices=DRIVERS, help=argparse.SUPPRESS)
    p.add_argument("--round-trips", type=int, default=10_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--drivers", nargs="*", choices=DRIVERS, default=list(DRIVERS))
    p.add_argument("--json", default=str(RESULTS_DIR / "sockets.json"))
    p.add_argument("--md", default=str(RESULTS_DIR / "sockets.md"))
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    try:
        import zmq_anyio  # noqa: F401
    except ImportError:
        print("[sockets] zmq-anyio is not installed; measuring the others", file=sys.stderr)
        args.drivers = [d for d in args.drivers if not d.startswith("zmq-anyio")]
    trials = []
    for rep in range(args.reps):
        for d in args.drivers:
            try:
                t = trial(d, args.round_trips)
            except Exception as exc:  # a bench reports any failure and goes on
                t = {"driver": d, "error": repr(exc)}
            print(f"[sockets] trial {rep + 1}/{args.reps} {d}: {t}", file=sys.stderr)
            trials.append(t)
    text = report(trials, args.drivers, args.round_trips)
    write_json(pathlib.Path(args.json), trials)
    pathlib.Path(args.md).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
