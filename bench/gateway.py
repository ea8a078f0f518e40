"""Remote-kernel start, interrupt and shutdown: trikernel's gateway-launch next to ipykernel's stock launcher.

Both run under the same provisioner: gateway_provisioners'
``DistributedProvisioner`` with ``remote_hosts: ["localhost"]`` (GP then
launches the kernelspec's argv locally, without SSH), driven by
jupyter_client's ``AsyncKernelManager``, on loopback. The kernelspecs:

- ``trikernel``: ``python -m trikernel install --gateway distributed``;
- ``ipykernel``: ``jupyter ssh-spec install`` (GP's own launch_ipykernel.py
  with its forked server listener), with the provisioner config made the
  same as trikernel's (remote_hosts, launch_timeout, port_range).

Per trial, one fresh kernel of each, interleaved: ``start`` (t0 before
``start_kernel()`` -> first ``kernel_info_reply``; GP checks for the payload
every ``GP_POLL_INTERVAL`` s, 0.5 by default, so this figure is quantised
by it; ``--poll-interval 0.05`` resolves the kernels' own time),
``interrupt`` (``interrupt_kernel()`` -> the KeyboardInterrupt raised in a
``time.sleep(30)`` cell, which prints ``time.time()`` when it catches it,
and -> that cell's ``execute_reply``; twice, because the first reply also
pays for the kernel's first traceback), ``shutdown``
(``shutdown_kernel()`` -> return), and what is left afterwards: processes
(the kernel and its children, psutil) and ports still accepting
connections (the five channels and the comm port). Then one
``shutdown_kernel(now=True)`` each, and the same count. Last, a crowd:
``--crowd`` kernels of each at once (``asyncio.gather``), all in one
1000-port range (GP's minimum; ``--port-range``), each must answer
``kernel_info`` and run ``1+1``; failures are counted with their reason
(the stock launcher releases the ports it picked before ipykernel binds
them again). Leftover processes are killed by pid at the end of each part.

Figures and trikernel / ipykernel ratios are printed and written to
``bench/results/gateway.{md,json}``; nothing is asserted.

Usage: python bench/gateway.py [--reps 3] [--crowd 20 | --no-crowd] [--poll-interval 0.5]
                               [--port-range 21000..22000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import RESULTS_DIR, fmt, machine, md_table, median, now_iso, ratio, versions, write_json

KERNELS = {"bench-tk-gw": "trikernel", "bench-ipk-gw": "ipykernel"}
CROWD_SUFFIX = "-range"


def _install_specs(root: pathlib.Path, port_range: str) -> str:
    """Both kernelspecs (and their crowd variants with a port range) under ``root``; returns the JUPYTER_PATH entry."""
    py = sys.executable
    bindir = str(pathlib.Path(py).parent)
    config = {"remote_hosts": ["localhost"], "launch_timeout": 120}
    for name, extra in (("bench-tk-gw", []), ("bench-tk-gw" + CROWD_SUFFIX, ["--port-range", port_range])):
        subprocess.run(
            [py, "-m", "trikernel", "install", "--prefix", str(root), "--name", name, "--gateway", "distributed",
             "--remote-hosts", "localhost", "--ip", "127.0.0.1", "--launch-timeout", "120", *extra],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    kernels = root / "share" / "jupyter" / "kernels"
    for name, rng in (("bench-ipk-gw", None), ("bench-ipk-gw" + CROWD_SUFFIX, port_range)):
        subprocess.run(
            [os.path.join(bindir, "jupyter-ssh-spec"), "install", "--prefix", str(root), "--kernel-name", name,
             "--remote-hosts", "localhost"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        path = kernels / name / "kernel.json"
        spec = json.loads(path.read_text())
        spec["argv"][0] = py  # GP writes "python"; use this interpreter, as trikernel's spec does
        spec["metadata"]["kernel_provisioner"]["config"] = {**config, **({"port_range": rng} if rng else {})}
        path.write_text(json.dumps(spec, indent=1))
    return str(root / "share" / "jupyter")


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _family(pid: int) -> list[int]:
    import psutil

    try:
        p = psutil.Process(pid)
        return [pid, *(c.pid for c in p.children(recursive=True))]
    except psutil.NoSuchProcess:
        return [pid]


def _accepting(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _ports(km: Any) -> list[int]:
    return [km.shell_port, km.iopub_port, km.stdin_port, km.control_port, km.hb_port, km.provisioner.comm_port]


def _kill(pids: list[int]) -> None:
    import psutil

    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


def _response_manager_reset() -> None:
    from gateway_provisioners.response_manager import ResponseManager

    if ResponseManager.initialized():
        ResponseManager.instance().stop_response_manager()
        ResponseManager.clear_instance()


async def _wait_reply(kc: Any, msg_id: str, within: float) -> dict[str, Any]:
    deadline = time.perf_counter() + within
    while True:
        m = await kc.get_shell_msg(timeout=max(0.1, deadline - time.perf_counter()))
        if m["parent_header"].get("msg_id") == msg_id:
            return m  # type: ignore[no-any-return]


async def _wait_stdout(kc: Any, msg_id: str, marker: str, within: float) -> None:
    deadline = time.perf_counter() + within
    seen = ""
    while marker not in seen:
        m = await kc.get_iopub_msg(timeout=max(0.1, deadline - time.perf_counter()))
        if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream":
            seen += m["content"]["text"]


#: Prints when it starts and, with the kernel's clock (same machine), when the interrupt lands.
INTERRUPT_CELL = """import time
print('STARTED', flush=True)
try:
    time.sleep(30)
except KeyboardInterrupt:
    print('CAUGHT', time.time(), flush=True)
    raise"""


async def _caught_at(kc: Any, msg_id: str, within: float) -> float:
    deadline = time.perf_counter() + within
    while True:
        m = await kc.get_iopub_msg(timeout=max(0.1, deadline - time.perf_counter()))
        if (
            m["parent_header"].get("msg_id") == msg_id
            and m["msg_type"] == "stream"
            and "CAUGHT" in m["content"]["text"]
        ):
            return float(m["content"]["text"].split()[1])


class StartFailed(Exception):
    """A kernel that did not become ready; ``km`` and its processes are kept for clean-up."""

    def __init__(self, km: Any, family: list[int], cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {str(cause)[:160]}")
        self.km, self.family = km, family


async def _start(
    name: str, within: float = 120, family: list[int] | None = None, log: dict[str, Any] | None = None
) -> tuple[Any, Any, float, float]:
    """Start and wait for kernel_info. ``family`` gets the launched process and its
    children right after GP reports the launch (before a failing kernel can orphan
    them); ``log["log"]`` the kernel's log file (GP's kernel_log)."""
    from jupyter_client import AsyncKernelManager

    km = AsyncKernelManager(kernel_name=name)
    t0 = time.perf_counter()
    await km.start_kernel()
    t_payload = time.perf_counter() - t0
    if family is not None:
        family.extend(_family(km.provisioner.pid))
    if log is not None:
        log["log"] = getattr(km.provisioner, "kernel_log", None)
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=within)
    except Exception as exc:
        kc.stop_channels()
        raise StartFailed(km, family or [], exc) from exc
    return km, kc, t_payload, time.perf_counter() - t0


async def _single(name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"kernel": name}
    km, kc, out["start_kernel_s"], out["ready_s"] = await _start(name)
    try:
        pid = km.provisioner.pid
        family = _family(pid)
        out["processes"] = len(family)
        ports = _ports(km)
        reply = await _wait_reply(kc, kc.execute("1+1"), 60)
        out["first_exec"] = reply["content"]["status"]
        for which in ("interrupt", "interrupt2"):  # the first one also pays for the first traceback
            msg_id = kc.execute(INTERRUPT_CELL)
            await _wait_stdout(kc, msg_id, "STARTED", 60)
            t0 = time.time()
            await km.interrupt_kernel()
            caught = await _caught_at(kc, msg_id, 60)
            reply = await _wait_reply(kc, msg_id, 60)
            out[f"{which}_s"] = time.time() - t0
            out[f"{which}_delivered_s"] = caught - t0
            out[f"{which}_ename"] = reply["content"].get("ename")
        kc.stop_channels()
        t0 = time.perf_counter()
        await km.shutdown_kernel()
        out["shutdown_s"] = time.perf_counter() - t0
        out["left_processes"] = [p for p in family if _alive(p)]
        out["left_ports"] = [p for p in ports if _accepting(p)]
        _kill(out["left_processes"])
    except BaseException:
        with contextlib.suppress(Exception):
            await km.shutdown_kernel(now=True)
        raise
    return out


async def _now(name: str) -> dict[str, Any]:
    km, kc, _, _ = await _start(name)
    family, ports = _family(km.provisioner.pid), _ports(km)
    kc.stop_channels()
    t0 = time.perf_counter()
    await km.shutdown_kernel(now=True)
    out = {"kernel": name, "shutdown_now_s": time.perf_counter() - t0}
    out["left_processes"] = [p for p in family if _alive(p)]
    out["left_ports"] = [p for p in ports if _accepting(p)]
    _kill(out["left_processes"])
    return out


def _read_log(path: str | None) -> str:
    with contextlib.suppress(OSError, TypeError):
        return pathlib.Path(path).read_text(errors="replace")  # type: ignore[arg-type]
    return ""


async def _crowd(name: str, n: int) -> dict[str, Any]:
    async def one(i: int) -> dict[str, Any]:
        r: dict[str, Any] = {"ok": False, "family": [], "km": None}
        try:
            r["km"], kc, _, r["ready_s"] = await _start(name, within=120, family=r["family"], log=r)
            reply = await _wait_reply(kc, kc.execute("1+1"), 60)
            r["ok"] = reply["content"]["status"] == "ok"
            kc.stop_channels()
        except StartFailed as exc:
            r["error"], r["km"] = str(exc), exc.km
        except Exception as exc:  # counted and reported
            r["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        return r

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - t0

    async def stop(r: dict[str, Any]) -> None:
        if r["km"] is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(r["km"].shutdown_kernel(now=not r["ok"]), 120)

    t0 = time.perf_counter()
    await asyncio.gather(*(stop(r) for r in results))
    stop_wall = time.perf_counter() - t0
    left = [p for r in results for p in r["family"] if _alive(p)]
    _kill(left)  # ours: processes this bench launched
    errors: dict[str, int] = {}
    for r in results:
        if not r["ok"]:
            key = r.get("error", "1+1 failed")
            errors[key] = errors.get(key, 0) + 1
    # what the kernels' own logs say (GP appends each kernel's output to its log)
    seen = {"address in use (failed kernels)": 0, "address in use (ready kernels)": 0, "bad signature": 0}
    for r in results:
        text = _read_log(r.get("log"))
        if "Address already in use" in text:
            seen["address in use (ready kernels)" if r["ok"] else "address in use (failed kernels)"] += 1
        if "Invalid Signature" in text:
            seen["bad signature"] += 1
    return {
        "kernel": name, "n": n, "ready": sum(r["ok"] for r in results), "wall_s": wall,
        "ready_median_s": median([r["ready_s"] for r in results if r["ok"] and "ready_s" in r]),
        "shutdown_all_s": stop_wall, "left_processes": len(left), "errors": errors, "in_logs": seen,
    }  # fmt: skip


def _run(coro_fn: Any, *args: Any) -> Any:
    async def main() -> Any:
        try:
            return await coro_fn(*args)
        finally:
            _response_manager_reset()

    return asyncio.run(main())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--crowd", type=int, default=20)
    ap.add_argument("--no-crowd", action="store_true")
    ap.add_argument("--poll-interval", type=float, default=None, help="GP_POLL_INTERVAL (GP's default 0.5)")
    ap.add_argument("--port-range", default="21000..22000")
    ap.add_argument("--parts", default="trials,now,crowd", help="comma-separated subset of trials,now,crowd")
    args = ap.parse_args()

    # gateway_provisioners reads these when imported
    os.environ["GP_RESPONSE_IP"] = "127.0.0.1"
    if args.poll_interval is not None:
        os.environ["GP_POLL_INTERVAL"] = str(args.poll_interval)
    os.environ.setdefault("KERNEL_USERNAME", "bench")  # GP refuses "root"
    logdir = RESULTS_DIR / "logs" / "gateway"
    logdir.mkdir(parents=True, exist_ok=True)
    os.environ["GP_KERNEL_LOG_DIR"] = str(logdir)
    os.environ["PATH"] = str(pathlib.Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")

    root = pathlib.Path(tempfile.mkdtemp(prefix="bench-gw-"))
    data: dict[str, Any] = {"when": now_iso(), "machine": machine(), "versions": versions(), "args": vars(args)}
    try:
        os.environ["JUPYTER_PATH"] = _install_specs(root, args.port_range)
        import importlib.metadata

        data["versions"]["gateway_provisioners"] = importlib.metadata.version("gateway_provisioners")
        parts = set(args.parts.split(","))
        trials: list[dict[str, Any]] = []
        for rep in range(args.reps + 1 if "trials" in parts else 0):  # round 0 warms caches and is dropped
            for name, label in KERNELS.items():
                try:
                    r = _run(_single, name)
                except Exception:  # report and go on
                    r = {"kernel": name, "error": traceback.format_exc(limit=3)}
                r["warmup"] = rep == 0
                trials.append(r)
                print(f"  {label:9} {'warm-up' if rep == 0 else f'trial {rep}'}: "
                      + ", ".join(f"{k}={fmt(v, 3) if isinstance(v, float) else v}" for k, v in r.items()
                                  if k not in ("kernel", "warmup")), flush=True)  # fmt: skip
        data["trials"] = trials
        data["now"] = [_run(_now, name) for name in KERNELS] if "now" in parts else []
        for r in data["now"]:
            print(f"  {KERNELS[r['kernel']]:9} now=True: {r}", flush=True)
        if not args.no_crowd and "crowd" in parts:
            data["crowd"] = [_run(_crowd, name + CROWD_SUFFIX, args.crowd) for name in KERNELS]
            for r in data["crowd"]:
                print(f"  crowd {r}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    md = _report(data)
    write_json(RESULTS_DIR / "gateway.json", data)
    (RESULTS_DIR / "gateway.md").write_text(md)
    print(md)
    return 0


def _report(data: dict[str, Any]) -> str:
    trials = [t for t in data["trials"] if not t.get("warmup") and "error" not in t]

    def med(name: str, key: str) -> float:
        return median([t[key] for t in trials if t["kernel"] == name and key in t])

    tk, ik = "bench-tk-gw", "bench-ipk-gw"
    rows = []
    for key, label in (("start_kernel_s", "start_kernel() returns (payload received)"),
                       ("ready_s", "start -> first kernel_info_reply"),
                       ("interrupt_delivered_s", "interrupt -> KeyboardInterrupt raised in the cell"),
                       ("interrupt_s", "interrupt -> execute_reply, first (first traceback)"),
                       ("interrupt2_s", "interrupt -> execute_reply, second"),
                       ("shutdown_s", "shutdown_kernel() (graceful)")):  # fmt: skip
        rows.append([label, fmt(med(tk, key), 3), fmt(med(ik, key), 3), ratio(med(tk, key), med(ik, key))])
    lines = [
        f"# Gateway launch: trikernel vs ipykernel's stock launcher under GP's DistributedProvisioner ({data['when']})",
        "",
        (
            f"machine: {data['machine']}; GP_POLL_INTERVAL={os.environ.get('GP_POLL_INTERVAL', '0.5 (default)')}; "
            f"versions: {json.dumps(data['versions'])}"
        ),
        "",
        f"Medians of {data['args']['reps']} trials (seconds):",
        "",
        md_table(["", "trikernel", "ipykernel", "trikernel / ipykernel"], rows),
        "",
    ]
    left = []
    for name, label in KERNELS.items():
        ts = [t for t in trials if t["kernel"] == name]
        now = next((r for r in data.get("now", []) if r["kernel"] == name), {})
        left.append([
            label, str(ts[0].get("processes", "?")) if ts else "?",
            str(sum(len(t.get("left_processes", [])) for t in ts)), str(sum(len(t.get("left_ports", [])) for t in ts)),
            str(len(now.get("left_processes", []))), str(len(now.get("left_ports", []))),
        ])  # fmt: skip
    lines += [
        md_table(
            [
                "kernel",
                "processes per kernel",
                "left after graceful (processes)",
                "(ports)",
                "left after now=True (processes)",
                "(ports)",
            ],
            left,
        ),
        "",
    ]
    if data.get("crowd"):
        rows = [[KERNELS[c["kernel"].removesuffix(CROWD_SUFFIX)], f"{c['ready']}/{c['n']}", fmt(c["wall_s"], 2),
                 fmt(c["ready_median_s"], 2), fmt(c["shutdown_all_s"], 2), str(c["left_processes"]),
                 "; ".join(f"{n}x {e}" for e, n in c["errors"].items()) or "-",
                 ", ".join(f"{k}: {v}" for k, v in c["in_logs"].items())] for c in data["crowd"]]  # fmt: skip
        lines += [
            f"Crowd: {data['crowd'][0]['n']} at once, port range {data['args']['port_range']}:",
            "",
            md_table(
                [
                    "kernel",
                    "ready",
                    "wall s",
                    "median ready s",
                    "shutdown all s",
                    "left processes",
                    "failures",
                    "kernel logs",
                ],
                rows,
            ),
            "",
        ]
    errors = [t for t in data["trials"] if "error" in t]
    if errors:
        lines += ["Failed trials:", ""] + [f"- {KERNELS[t['kernel']]}: {t['error'].splitlines()[-1]}" for t in errors]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
