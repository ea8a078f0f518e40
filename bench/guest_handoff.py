"""Why the plain user run is not a trio guest: the cost of guest mode per hand-off.

No kernel. The main thread runs a trio run as trikernel's user run does; a
second thread runs a trio run as the io thread does and hands it jobs the
way core/kernelcore.py does (``TrioToken.run_sync_soon`` into a memory channel;
the job answers through the io run's token). Timed: one hand-off and its
answer, ``--n`` times, 0.5 ms apart, for

- ``plain``: the main thread's run under ``trio.run`` (trio waits for I/O
  on the main thread);
- ``guest``: the same run under ``trio.lowlevel.start_guest_run`` on the
  smallest host loop there is (callbacks from a ``queue.SimpleQueue`` on the
  main thread): trio waits for I/O in its worker thread, which posts each
  wake-up to the host, one more thread hop per wake-up.

Prints medians, p90, p99 and the process CPU time. Nothing is asserted.
Usage: python bench/guest_handoff.py [--n 3000] [--reps 3]
"""

from __future__ import annotations

import argparse
import queue
import statistics
import threading
import time
from typing import Any

import trio


async def user_main(ready: threading.Event, box: dict[str, Any]) -> None:
    send, recv = trio.open_memory_channel[Any](4)
    box["send"] = send
    box["token"] = trio.lowlevel.current_trio_token()
    ready.set()
    async for io_token, event in recv:
        if event is None:
            return
        io_token.run_sync_soon(event.set)


def io_thread(ready: threading.Event, box: dict[str, Any], n: int, out: list[float]) -> None:
    ready.wait()

    async def main() -> None:
        token = trio.lowlevel.current_trio_token()
        for _ in range(n):
            event = trio.Event()
            t0 = time.perf_counter()
            box["token"].run_sync_soon(box["send"].send_nowait, (token, event))
            await event.wait()
            out.append(time.perf_counter() - t0)
            await trio.sleep(0.0005)
        box["token"].run_sync_soon(box["send"].send_nowait, (token, None))

    trio.run(main)


def one(mode: str, n: int) -> tuple[list[float], float]:
    ready, box, out = threading.Event(), {}, []  # type: ignore[var-annotated]
    t = threading.Thread(target=io_thread, args=(ready, box, n, out))
    t.start()
    c0 = time.process_time()
    if mode == "plain":
        trio.run(user_main, ready, box)
    else:
        q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        done: list[Any] = []
        trio.lowlevel.start_guest_run(user_main, ready, box, run_sync_soon_threadsafe=q.put, done_callback=done.append)
        while not done:
            q.get()()
        done[0].unwrap()
    t.join()
    return sorted(out), time.process_time() - c0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    medians: dict[str, list[float]] = {"plain": [], "guest": []}
    cpus: dict[str, list[float]] = {"plain": [], "guest": []}
    for rep in range(args.reps):
        for mode in ("plain", "guest"):
            xs, cpu = one(mode, args.n)
            medians[mode].append(statistics.median(xs))
            cpus[mode].append(cpu)
            print(
                f"rep {rep} {mode:5}: hand-off median {statistics.median(xs) * 1e6:6.1f} us, "
                f"p90 {_q(xs, 0.9):7.1f} us, p99 {_q(xs, 0.99):7.1f} us, process CPU {cpu:.2f} s"
            )
    p, g = statistics.median(medians["plain"]), statistics.median(medians["guest"])
    print(
        f"median of medians: plain {p * 1e6:.1f} us, guest {g * 1e6:.1f} us ({g / p:.2f}x); "
        f"CPU plain {statistics.median(cpus['plain']):.2f} s, guest {statistics.median(cpus['guest']):.2f} s"
    )
    return 0


def _q(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e6


if __name__ == "__main__":
    raise SystemExit(main())
