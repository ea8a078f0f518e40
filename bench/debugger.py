"""What the debugger's tracing costs once it was turned on (issue 11).

Kernels, in one run, trials interleaved: trikernel (the kernelspec
``trikernel.kernelspec.kernel_json`` writes: ``-Xfrozen_modules=off``) and
ipykernel (``python -Xfrozen_modules=off -m ipykernel_launcher``, as its
own kernelspec), both with debugpy from this venv.

Phases, each driven as JupyterLab drives them (debug_request on control):

- ``off``: the kernel as started, the debugger never turned on;
- ``on``: after ``initialize`` + ``attach`` + ``configurationDone``, no breakpoint;
- ``after disconnect``: after ``disconnect`` (``terminateDebuggee`` false).

Rows: wall time inside the kernel of

- ``trio checkpoints``: ``await trio.lowlevel.checkpoint()`` ``--checkpoints``
  times (trikernel: top-level await in the cell's trio run; ipykernel:
  ``trio.run`` of the same function in the cell, as it has no trio loop);
- ``python loop``: ``x += i`` ``--loop`` times in a function defined in a cell;
- ``kernel RSS``: the kernel process's resident memory after the phase
  change (psutil; debugpy's adapter is a process of its own, not counted).

The functions are defined again after every phase change, so in every phase
they are cell code under the names the kernel gives cells then. Medians of
``--reps`` trials and the ratio to ``off`` of the same kernel. Nothing is
asserted. Usage:
python bench/debugger.py [--reps 5] [--checkpoints 50000] [--loop 2000000] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _common import RESULTS_DIR, machine, md_table, now_iso, versions, write_json
from jupyter_client.manager import KernelManager

from trikernel.launch.kernelspec import kernel_json

DEFINE = """
import time, trio
def _loop(n):
    x = 0
    for i in range(n):
        x += i
    return x
async def _checkpoints(n):
    for _ in range(n):
        await trio.lowlevel.checkpoint()
"""
CHECKPOINTS = {
    "trikernel": "_t = time.perf_counter(); await _checkpoints({n}); _dt = time.perf_counter() - _t",
    "ipykernel": "_t = time.perf_counter(); trio.run(_checkpoints, {n}); _dt = time.perf_counter() - _t",
}
LOOP = "_t = time.perf_counter(); _loop({n}); _dt = time.perf_counter() - _t"
INIT = {"clientID": "bench", "adapterID": "", "pathFormat": "path", "linesStartAt1": True, "columnsStartAt1": True}
PHASES = ("off", "on", "after disconnect")


class Kernel:
    def __init__(self, label: str, spec_name: str):
        self.label = label
        self.km = KernelManager(kernel_name=spec_name)
        self.km.start_kernel(stdout=open(os.devnull, "w"), stderr=open(os.devnull, "w"))  # noqa: SIM115
        self.kc = self.km.client()
        self.kc.start_channels(hb=False)
        self.kc.wait_for_ready(timeout=60)
        self.seq = 0

    def execute(self, code: str, timeout: float = 600) -> dict[str, Any]:
        msg_id = self.kc.execute(code, user_expressions={"dt": "_dt"} if "_dt =" in code else {})
        while True:
            r = self.kc.get_shell_msg(timeout=timeout)
            if r["parent_header"].get("msg_id") == msg_id:
                assert r["content"]["status"] == "ok", r["content"]
                return r["content"]  # type: ignore[no-any-return]

    def timed(self, code: str) -> float:
        c = self.execute(code)
        return float(c["user_expressions"]["dt"]["data"]["text/plain"])

    def debug(self, command: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        self.seq += 1
        msg = self.kc.session.msg(
            "debug_request", {"type": "request", "seq": self.seq, "command": command, "arguments": arguments or {}}
        )
        self.kc.control_channel.send(msg)
        while True:
            r = self.kc.get_control_msg(timeout=60)
            if r["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                assert r["content"].get("success"), r["content"]
                return r["content"]  # type: ignore[no-any-return]

    def phase(self, name: str) -> None:
        if name == "on":
            self.debug("initialize", INIT)
            self.debug("attach")
            self.debug("configurationDone")
        elif name == "after disconnect":
            self.debug("disconnect", {"restart": False, "terminateDebuggee": False})
        self.execute(DEFINE)

    def rss_mib(self) -> float:
        import psutil

        return float(psutil.Process(self.km.provisioner.pid).memory_info().rss) / 2**20  # type: ignore[union-attr]

    def stop(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def _write_specs(root: str) -> None:
    specs = {
        "bench-trikernel": kernel_json(python=sys.executable, display_name="bench-trikernel"),
        "bench-ipykernel": {
            "argv": [sys.executable, "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "bench-ipykernel",
            "language": "python",
            "metadata": {"debugger": True},
        },
    }
    for name, spec in specs.items():
        d = os.path.join(root, "kernels", name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "kernel.json"), "w") as f:
            json.dump(spec, f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--checkpoints", type=int, default=50_000)
    ap.add_argument("--loop", type=int, default=2_000_000)
    ap.add_argument("--json", default=str(RESULTS_DIR / "debugger.json"))
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-debugger-")
    _write_specs(root)
    os.environ["JUPYTER_PATH"] = root + os.pathsep + os.environ.get("JUPYTER_PATH", "")
    kernels = [Kernel("trikernel", "bench-trikernel"), Kernel("ipykernel", "bench-ipykernel")]
    figures: dict[str, dict[str, dict[str, list[float]]]] = {k.label: {} for k in kernels}
    rss: dict[str, dict[str, float]] = {k.label: {} for k in kernels}
    try:
        for phase in PHASES:
            for k in kernels:
                k.phase(phase)
                rss[k.label][phase] = k.rss_mib()
            for _ in range(args.reps):
                for k in kernels:
                    row = figures[k.label].setdefault(phase, {"trio checkpoints": [], "python loop": []})
                    row["trio checkpoints"].append(k.timed(CHECKPOINTS[k.label].format(n=args.checkpoints)))
                    row["python loop"].append(k.timed(LOOP.format(n=args.loop)))
    finally:
        for k in kernels:
            k.stop()
    rows = []
    for label in figures:
        for what in ("trio checkpoints", "python loop"):
            base = statistics.median(figures[label]["off"][what])
            cells = [label, what]
            for phase in PHASES:
                med = statistics.median(figures[label][phase][what])
                cells.append(f"{med:.3f} s ({med / base:.2f}x)")
            rows.append(cells)
        rows.append([label, "kernel RSS", *(f"{rss[label][p]:.0f} MiB" for p in PHASES)])
    table = md_table(["kernel", "loop", *PHASES], rows)
    print(f"{machine()}; {args.checkpoints} checkpoints, {args.loop} loop iterations, median of {args.reps}")
    print(table)
    write_json(
        __import__("pathlib").Path(args.json),
        {
            "when": now_iso(),
            "machine": machine(),
            "versions": versions(),
            "args": vars(args),
            "figures": figures,
            "rss_mib": rss,
            "python": sys.version,
            "clock": time.get_clock_info("perf_counter").implementation,
        },
    )


if __name__ == "__main__":
    main()
