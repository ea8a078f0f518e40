"""Subshells (JEP 91): how fast a subshell answers while the main shell is busy.

For each kernelspec (trikernel, ipykernel; xeus-python has no subshells and
is skipped when it does not list ``kernel subshells``), one warm kernel:

- ``1+1 idle``: ``execute_request("1+1")`` to a subshell while the main
  shell is idle, send → ``execute_reply`` (``--reps`` times, median, p90);
- ``1+1 busy``: the same while the main shell runs ``time.sleep`` (a
  synchronous cell: the case subshells exist for);
- ``comm busy``: a ``comm_msg`` sent over the subshell to a comm (created
  by a main-shell cell) whose ``on_msg`` answers with ``comm.send``, send →
  the kernel's ``comm_msg`` on IOPub, while the main shell sleeps (ipykernel
  7.4 routes it to the main shell, where the comm was opened: no answer
  until the cell ends);
- ``3 x sleep(1)``: three subshells each run ``time.sleep(1)`` at once,
  wall time to the last reply.

Nothing is asserted. Usage: python bench/subshells.py [--reps 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from queue import Empty
from typing import Any

sys.path.insert(0, __import__("os").path.dirname(__file__))

from _common import (
    RESULTS_DIR,
    available_kernels,
    kernel,
    label,
    machine,
    md_table,
    now_iso,
    ratio,
    versions,
    write_json,
)

#: Seconds a comm_msg may wait for its answer before it counts as blocked.
COMM_WAIT = 5.0


def control(kc: Any, msg_type: str, content: dict[str, Any] | None = None) -> dict[str, Any]:
    msg = kc.session.msg(msg_type, content or {})
    kc.control_channel.send(msg)
    while True:
        reply = kc.get_control_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return dict(reply["content"])


def send(kc: Any, msg_type: str, content: dict[str, Any], subshell_id: str | None) -> str:
    msg = kc.session.msg(msg_type, content)
    if subshell_id is not None:
        msg["header"]["subshell_id"] = subshell_id
    kc.shell_channel.send(msg)
    return str(msg["header"]["msg_id"])


def execute(kc: Any, code: str, subshell_id: str | None) -> str:
    return send(
        kc,
        "execute_request",
        {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False},
        subshell_id,
    )


def wait_reply(kc: Any, msg_id: str, stash: dict[str, Any]) -> Any:
    while msg_id not in stash:
        r = kc.get_shell_msg(timeout=60)
        stash[r["parent_header"].get("msg_id")] = r
    return stash.pop(msg_id)


def probe(kc: Any, subshell_id: str, reps: int, stash: dict[str, Any]) -> list[float]:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        wait_reply(kc, execute(kc, "1+1", subshell_id), stash)
        times.append(time.perf_counter() - t0)
    return times


def comm_probe(kc: Any, subshell_id: str, comm_id: str, reps: int) -> list[float] | None:
    """None when the handler did not answer within COMM_WAIT while the main shell is busy."""
    times = []
    for i in range(reps):
        t0 = time.perf_counter()
        send(kc, "comm_msg", {"comm_id": comm_id, "data": {"ping": i}}, subshell_id)
        while True:
            try:
                m = kc.get_iopub_msg(timeout=max(0.01, t0 + COMM_WAIT - time.perf_counter()))
            except Empty:
                return None
            if m["msg_type"] == "comm_msg" and m["content"]["data"].get("pong") == i:
                break
        times.append(time.perf_counter() - t0)
    return times


def bench(name: str, reps: int) -> dict[str, Any] | None:
    print(f"{label(name)} ...", flush=True)
    with kernel(name, log_tag="-subshells") as k:
        kc = k.kc
        kc.kernel_info()
        info = kc.get_shell_msg(timeout=30)["content"]
        if "kernel subshells" not in info.get("supported_features", []):
            print(f"{label(name)}: no kernel subshells; skipped")
            return None
        stash: dict[str, Any] = {}
        sid = control(kc, "create_subshell_request")["subshell_id"]
        wait_reply(
            kc,
            execute(
                kc,
                "import time\nfrom comm import create_comm\n"
                "c = create_comm(target_name='bench')\n"
                "c.on_msg(lambda m: c.send({'pong': m['content']['data']['ping']}))\n"
                "print(c.comm_id)",
                None,
            ),
            stash,
        )
        comm_id = ""
        while not comm_id:
            m = kc.get_iopub_msg(timeout=30)
            if m["msg_type"] == "stream":
                comm_id = m["content"]["text"].strip()
        probe(kc, sid, 3, stash)  # warm-up
        idle = probe(kc, sid, reps, stash)
        main = execute(kc, "time.sleep(3600)", None)
        time.sleep(0.5)  # the main cell is in its sleep (a bench: no marker needed)
        busy = probe(kc, sid, reps, stash)
        comm = comm_probe(kc, sid, comm_id, reps)
        k.km.interrupt_kernel()
        wait_reply(kc, main, stash)
        time.sleep(0.5)  # blocked comm answers arrive after the main cell; let them pass
        while True:
            try:
                kc.get_iopub_msg(timeout=0.2)
            except Empty:
                break
        ids = [control(kc, "create_subshell_request")["subshell_id"] for _ in range(3)]
        t0 = time.perf_counter()
        for m in [execute(kc, "time.sleep(1)", s) for s in ids]:
            wait_reply(kc, m, stash)
        three = time.perf_counter() - t0
        return {"idle": idle, "busy": busy, "comm": comm, "three": three}


def p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10)[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    results = {name: r for name in available_kernels() if (r := bench(name, args.reps)) is not None}
    rows = []
    for key, what in (
        ("idle", "subshell 1+1, main idle"),
        ("busy", "subshell 1+1, main in time.sleep"),
        ("comm", "comm_msg round trip over a subshell, main in time.sleep"),
    ):
        row: list[Any] = [what]
        for name in results:
            xs = results[name][key]
            row.append(
                f"{statistics.median(xs) * 1000:.2f} / {p90(xs) * 1000:.2f}"
                if xs
                else f"no answer in {COMM_WAIT:.0f} s (waits for the main cell)"
            )
        if "trikernel" in results and "python3" in results:
            a, b = results["trikernel"][key], results["python3"][key]
            row.append(ratio(statistics.median(a), statistics.median(b)) if a and b else "-")
        rows.append(row)
    row = ["3 subshells x time.sleep(1), wall s"] + [f"{results[n]['three']:.3f}" for n in results]
    if "trikernel" in results and "python3" in results:
        row.append(ratio(results["trikernel"]["three"], results["python3"]["three"]))
    rows.append(row)
    headers = ["ms median / p90", *(label(n) for n in results), "trikernel / ipykernel"]
    table = md_table(headers, rows)
    print(f"\n{now_iso()} on {machine()}, {args.reps} reps\n{versions()}\n\n{table}")
    write_json(RESULTS_DIR / "subshells.json", {"reps": args.reps, "results": results, "versions": versions()})


if __name__ == "__main__":
    main()
