"""Start-up speed: launch -> first kernel_info_reply, classic vs JEP 66 handshake, and a crowd start.

Part 1, single kernel (``--reps`` trials per mode, interleaved, median):
``km.start_kernel()`` is called at t0; then a fresh DEALER (reconnect
interval 5 ms, so the figure resolves the kernel, not libzmq's default
100 ms reconnect back-off) sends ``kernel_info_request`` on the shell port
until the reply arrives (t_info), then ``execute_request("1+1")`` on the
same socket (t_exec: the kernel really executes code). Modes:

- ``trikernel classic``, ``ipykernel classic``, ``xeus-python classic``:
  jupyter_client's default LocalProvisioner (ports picked by the client).
- ``trikernel handshake``: the ``trikernel-handshake`` provisioner (entry
  point group ``jupyter_client.kernel_provisioners``); ``start_kernel``
  returns once the kernel registered its own ports.
- ``xeus-python handshake``: the same provisioner, forced on for xpython
  (``handshake: true``, ``registration_port_format: "str"``).

Part 2, crowd start: 40 kernels at once from 4 processes (10 each,
``AsyncKernelManager`` + ``asyncio.gather``, a barrier releases all four
processes together); each kernel must answer ``kernel_info`` and execute
``1+1``. Wall time from the barrier to the last ``1+1`` reply, and the
failures, for trikernel through the handshake provisioner and, for
comparison, trikernel and ipykernel started classic (port race possible).

Provisioner parts are skipped with a message when ``trikernel-handshake``
is not installed or does not work. Nothing is asserted.

``--baseline REV ...`` adds to part 1 trikernel as of each git revision
(``git archive`` of ``trikernel/`` on ``sys.path``, started with the
interpreter flags of the installed ``trikernel`` kernelspec: bench/_common.py
``baseline_kernelspec``), classic, in the same interleaved rounds; the
table then also gives each trikernel's ratio to the first baseline.

Usage: python bench/startup.py [--reps 10] [--crowd 4x10] [--no-crowd] [--baseline REV ...]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import multiprocessing as mp
import os
import pathlib
import queue
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any

import zmq

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import (
    LOG_DIR,
    RESULTS_DIR,
    available_kernels,
    baseline_kernelspecs,
    fmt,
    label,
    md_table,
    median,
    ratio,
    run_record,
    wall_note,
    with_baselines,
    write_json,
)

PROVISIONER = "trikernel-handshake"
XPY_HANDSHAKE_CONFIG = {"handshake": True, "registration_port_format": "str"}
#: Seconds a crowd kernel may take to answer kernel_info (and then 1+1) before it counts as failed.
CROWD_READY_TIMEOUT = 30.0


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def provisioner_status() -> tuple[bool, str]:
    eps = importlib.metadata.entry_points(group="jupyter_client.kernel_provisioners")
    for ep in eps:
        if ep.name == PROVISIONER:
            try:
                ep.load()
            except Exception as exc:  # any import error means "not available yet"
                return False, f"entry point {PROVISIONER} ({ep.value}) does not load: {exc!r}"
            return True, f"{PROVISIONER} -> {ep.value}"
    return False, f"no entry point {PROVISIONER!r} in group jupyter_client.kernel_provisioners"


def _use_provisioner(km: Any, config: dict[str, Any] | None = None) -> None:
    """Select the handshake provisioner for this KernelManager's (cached) kernelspec."""
    spec = km.kernel_spec
    spec.metadata = dict(spec.metadata or {})
    spec.metadata["kernel_provisioner"] = {"provisioner_name": PROVISIONER, "config": dict(config or {})}


# -- part 1 -------------------------------------------------------------------


def one_start(kernel_name: str, mode: str, tag: str, timeout: float = 60.0) -> dict[str, Any]:
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name=kernel_name)
    if mode == "handshake":
        _use_provisioner(km, XPY_HANDSHAKE_CONFIG if kernel_name == "xpython" else None)
    else:
        km.kernel_spec  # load the spec outside the timed region, like the handshake case  # noqa: B018
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"kernel": kernel_name, "mode": mode, "ok": False}
    with open(LOG_DIR / f"startup-{kernel_name}-{mode}-{tag}.log", "w") as log:
        ctx = zmq.Context()
        sock = None
        try:
            t0 = time.perf_counter()
            km.start_kernel(stdout=log, stderr=log)
            res["t_started"] = time.perf_counter() - t0
            info = km.get_connection_info()
            sock = ctx.socket(zmq.DEALER)
            sock.linger = 0
            sock.setsockopt(zmq.RECONNECT_IVL, 5)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, 5)
            sock.connect(f"tcp://{info['ip']}:{info['shell_port']}")
            session = km.session
            ki = session.msg("kernel_info_request", {})
            session.send(sock, ki)
            deadline = t0 + timeout
            got_info = False
            while time.perf_counter() < deadline:
                if sock.poll(50):
                    _, frames = session.feed_identities(sock.recv_multipart())
                    msg = session.deserialize(frames, content=False)
                    pid = msg["parent_header"].get("msg_id")
                    if pid == ki["header"]["msg_id"]:
                        res["t_info"] = time.perf_counter() - t0
                        got_info = True
                        break
                if not km.is_alive():
                    res["error"] = "kernel exited before answering kernel_info"
                    break
            if got_info:
                ex = session.msg(
                    "execute_request",
                    {
                        "code": "1+1",
                        "silent": False,
                        "store_history": False,
                        "user_expressions": {},
                        "allow_stdin": False,
                        "stop_on_error": True,
                    },
                )
                session.send(sock, ex)
                while time.perf_counter() < deadline:
                    if sock.poll(50):
                        _, frames = session.feed_identities(sock.recv_multipart())
                        msg = session.deserialize(frames)
                        if msg["parent_header"].get("msg_id") == ex["header"]["msg_id"]:
                            res["t_exec"] = time.perf_counter() - t0
                            res["ok"] = msg["content"].get("status") == "ok"
                            break
            if not res["ok"] and "error" not in res:
                res["error"] = "no reply within timeout"
        except Exception as exc:  # a bench reports any failure and goes on
            res["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            if sock is not None:
                sock.close(0)
            ctx.term()
            try:
                km.shutdown_kernel(now=True)
            except Exception as exc:  # a bench reports any failure and goes on
                res.setdefault("shutdown_error", repr(exc))
    return res


def bench_single(modes: list[tuple[str, str]], reps: int) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {f"{k} {m}": [] for k, m in modes}
    for k, m in modes:  # warm-up round (file cache, .pyc), not counted
        one_start(k, m, "warmup")
    for rep in range(reps):
        for k, m in modes:
            r = one_start(k, m, str(rep + 1))
            out[f"{k} {m}"].append(r)
            _log(
                f"[startup] {label(k):12} {m:9} rep {rep + 1}: started {fmt(r.get('t_started'), 3)}s "
                f"kernel_info {fmt(r.get('t_info'), 3)}s 1+1 {fmt(r.get('t_exec'), 3)}s"
                + (f" ERROR {r['error']}" if r.get("error") else "")
            )
            time.sleep(0.2)
    return out


# -- part 2: crowd -----------------------------------------------------------------


async def _crowd_worker_async(kernel_name: str, mode: str, n: int, barrier: Any, wid: int) -> list[dict[str, Any]]:
    from jupyter_client import AsyncKernelManager

    kms = []
    for _ in range(n):
        km = AsyncKernelManager(kernel_name=kernel_name)
        if mode == "handshake":
            _use_provisioner(km)
        else:
            km.kernel_spec  # noqa: B018
        kms.append(km)
    # opened before the barrier, outside the timed region
    logs = [open(LOG_DIR / f"crowd-{kernel_name}-{mode}-{wid}-{i}.log", "w") for i in range(n)]  # noqa: SIM115, ASYNC230

    async def start(i: int, km: Any, t0: float) -> dict[str, Any]:
        r: dict[str, Any] = {"ok": False, "t0": t0}
        kc = None
        try:
            await km.start_kernel(stdout=logs[i], stderr=logs[i])
            r["t_started"] = time.time()
            kc = km.client()
            kc.start_channels(hb=False)
            await kc.wait_for_ready(timeout=CROWD_READY_TIMEOUT)
            r["t_ready"] = time.time()
            msg_id = kc.execute("1+1")
            while True:
                reply = await kc.get_shell_msg(timeout=CROWD_READY_TIMEOUT)
                if reply["parent_header"].get("msg_id") == msg_id:
                    break
            r["t_exec"] = time.time()
            r["ok"] = reply["content"]["status"] == "ok"
            if not r["ok"]:
                r["error"] = f"1+1 status {reply['content']['status']}"
        except Exception as exc:  # a bench reports any failure and goes on
            r["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            r["t_fail"] = time.time()
        finally:
            if kc is not None:
                kc.stop_channels()
        return r

    barrier.wait(timeout=120)
    t0 = time.time()

    async def bounded(i: int, km: Any) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(start(i, km, t0), CROWD_READY_TIMEOUT + 15)
        except TimeoutError:
            return {
                "ok": False,
                "t0": t0,
                "error": f"start + kernel_info + 1+1 took over {CROWD_READY_TIMEOUT + 15:.0f}s",
            }

    results = await asyncio.gather(*(bounded(i, km) for i, km in enumerate(kms)))

    async def stop(km: Any) -> None:
        try:
            await asyncio.wait_for(km.shutdown_kernel(now=True), 15)
        except Exception:  # last resort below
            proc = getattr(km.provisioner, "process", None)
            if proc is not None:
                proc.kill()

    await asyncio.gather(*(stop(km) for km in kms), return_exceptions=True)
    for f in logs:
        f.close()
    for i, r in enumerate(results):
        if not r["ok"]:
            tail = (LOG_DIR / f"crowd-{kernel_name}-{mode}-{wid}-{i}.log").read_text(errors="replace").strip()
            r["log_tail"] = "\n".join(tail.splitlines()[-6:])
    return list(results)


def _crowd_worker(kernel_name: str, mode: str, n: int, barrier: Any, q: Any, wid: int) -> None:
    try:
        q.put((wid, asyncio.run(_crowd_worker_async(kernel_name, mode, n, barrier, wid))))
    except BaseException:  # the parent must hear about any crash, else it waits
        q.put((wid, [{"ok": False, "error": "worker crashed: " + traceback.format_exc()[-800:]}]))


def crowd(
    kernel_name: str, mode: str, procs: int, per: int, timeout: float = CROWD_READY_TIMEOUT + 60
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    q = ctx.Queue()
    ps = [ctx.Process(target=_crowd_worker, args=(kernel_name, mode, per, barrier, q, w)) for w in range(procs)]
    for p in ps:
        p.start()
    results: list[dict[str, Any]] = []
    end = time.monotonic() + timeout
    got = 0
    while got < procs and time.monotonic() < end:
        try:
            _, rs = q.get(timeout=max(0.1, end - time.monotonic()))
        except queue.Empty:
            break
        results.extend(rs)
        got += 1
    for p in ps:
        p.join(10)
        if p.is_alive():
            p.kill()
    ok = [r for r in results if r.get("ok")]
    t0 = min((r["t0"] for r in results if "t0" in r), default=None)
    out: dict[str, Any] = {
        "kernel": kernel_name,
        "mode": mode,
        "requested": procs * per,
        "reported": len(results),
        "ok": len(ok),
        "failed": procs * per - len(ok),
        "errors": [
            r.get("error", "") + ("\n" + r["log_tail"] if r.get("log_tail") else "") for r in results if not r.get("ok")
        ],
    }
    if t0 is not None and ok:
        out["wall_all_exec"] = max(r["t_exec"] for r in ok) - t0
        out["median_ready"] = median([r["t_ready"] - t0 for r in ok])
        out["max_ready"] = max(r["t_ready"] - t0 for r in ok)
    if got < procs:
        out["errors"].append(f"{procs - got} worker process(es) did not report within {timeout:.0f}s")
    return out


# -- report ------------------------------------------------------------------


def report(
    single: dict[str, list[dict[str, Any]]],
    crowds: list[dict[str, Any]],
    notes: list[str],
    reps: int,
    bases: list[str] | None = None,
) -> str:
    rows = []
    med: dict[str, dict[str, float]] = {}
    for key, runs in single.items():
        ok = [r for r in runs if r.get("ok")]
        m = {f: median([r[f] for r in ok if f in r]) for f in ("t_started", "t_info", "t_exec")}
        med[key] = m
        k, mode = key.split(" ", 1)
        rows.append(
            [
                f"{label(k)} {mode}",
                f"{len(ok)}/{len(runs)}",
                fmt(m["t_started"] * 1000, 0),
                fmt(m["t_info"] * 1000, 0),
                fmt(min((r["t_info"] for r in ok), default=float("nan")) * 1000, 0),
                fmt(m["t_exec"] * 1000, 0),
            ]
        )
    base = med.get("python3 classic", {})
    first = med.get(f"{bases[0]} classic", {}) if bases else {}
    for row, key in zip(rows, single, strict=False):
        row.append(ratio(med[key].get("t_info"), base.get("t_info")))
        row.append(ratio(med[key].get("t_exec"), base.get("t_exec")))
        if bases:
            mine = key.startswith(("trikernel ", *(f"{b} " for b in bases)))
            row.append(ratio(med[key].get("t_info"), first.get("t_info")) if mine else "")
            row.append(ratio(med[key].get("t_exec"), first.get("t_exec")) if mine else "")
    table = md_table(
        [
            "start",
            "ok",
            "start_kernel() returned, ms",
            "first kernel_info_reply, ms (median)",
            "(best)",
            "first 1+1 execute_reply, ms",
            "kernel_info vs ipykernel classic",
            "1+1 vs ipykernel classic",
            *([f"kernel_info vs {bases[0]}", f"1+1 vs {bases[0]}"] if bases else []),
        ],
        rows,
    )
    parts = [
        "### Start-up",
        "",
        (
            f"Single kernel, {reps} trials per mode (interleaved), medians; target: trikernel kernel_info "
            "< 0.5x ipykernel's."
        ),
        "",
        table,
    ]
    if crowds:
        crows = [
            [
                f"{label(c['kernel'])} {c['mode']}",
                f"{c['ok']}/{c['requested']}",
                fmt(c.get("wall_all_exec"), 2),
                fmt(c.get("median_ready"), 2),
                fmt(c.get("max_ready"), 2),
            ]
            for c in crowds
        ]
        parts += [
            "",
            "Crowd start: 40 kernels at once from 4 processes (10 each); each must answer kernel_info and run 1+1:",
            "",
            md_table(["crowd", "ready + 1+1 ok", "wall s to last 1+1", "median s to ready", "max s to ready"], crows),
        ]
        errs = [(c, e) for c in crowds for e in c["errors"]]
        if errs:
            parts += ["", "Crowd failures:", ""]
            for c, e in errs[:20]:
                parts.append(f"- {label(c['kernel'])} {c['mode']}: " + e.replace("\n", "\n    "))
            if len(errs) > 20:
                parts.append(f"- ... and {len(errs) - 20} more (see startup.json)")
    single_errs = [(k, r) for k, runs in single.items() for r in runs if r.get("error")]
    if single_errs:
        parts += ["", "Single-start failures:", ""]
        for k, r in single_errs:
            parts.append(f"- {k}: {r['error']}")
    if notes:
        parts += ["", *[f"Note: {n}" for n in notes]]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--kernels", nargs="*", default=None)
    p.add_argument("--crowd", default="4x10", help="PROCSxKERNELS, default 4x10")
    p.add_argument("--no-crowd", action="store_true")
    p.add_argument(
        "--crowd-classic",
        nargs="*",
        default=["trikernel", "python3"],
        help="kernelspecs also crowd-started the classic way for comparison (default: trikernel python3)",
    )
    p.add_argument("--baseline", nargs="*", default=[], help="git revisions of trikernel to compare with")
    p.add_argument("--json", default=str(RESULTS_DIR / "startup.json"))
    p.add_argument("--md", default=str(RESULTS_DIR / "startup.md"))
    args = p.parse_args(argv)
    t_begin = time.monotonic()
    load = {"start": os.getloadavg()}
    root = pathlib.Path(tempfile.mkdtemp(prefix="bench-startup-"))
    try:
        bases = baseline_kernelspecs(args.baseline, root)
        return _main(args, bases, t_begin, load)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _main(args: Any, bases: list[str], t_begin: float, load: dict[str, Any]) -> int:
    kernels = available_kernels(args.kernels)
    have_prov, prov_msg = provisioner_status()
    notes: list[str] = []
    modes = [(k, "classic") for k in with_baselines(kernels, bases)]
    if have_prov:
        _log(f"[startup] provisioner: {prov_msg}")
        # smoke test: does a handshake start work at all?
        probe = one_start("trikernel", "handshake", "probe") if "trikernel" in kernels else {"ok": False}
        if probe.get("ok"):
            modes.append(("trikernel", "handshake"))
        else:
            have_prov = False
            notes.append(f"handshake start of trikernel does not work yet, skipped: {probe.get('error')}")
        if "xpython" in kernels:
            probe = one_start("xpython", "handshake", "probe")
            if probe.get("ok"):
                modes.append(("xpython", "handshake"))
            else:
                notes.append(f"xeus-python handshake start failed, skipped: {probe.get('error')}")
    else:
        notes.append(f"handshake parts skipped: {prov_msg}")
        _log(f"[startup] SKIP handshake: {prov_msg}")
    single = bench_single(modes, args.reps)

    crowds: list[dict[str, Any]] = []
    if not args.no_crowd:
        procs, per = (int(x) for x in args.crowd.lower().split("x"))
        plan = []
        if have_prov and "trikernel" in kernels:
            plan.append(("trikernel", "handshake"))
        else:
            notes.append("crowd start through the provisioner skipped (provisioner unavailable)")
        plan += [(k, "classic") for k in args.crowd_classic if k in kernels]
        for k, m in plan:
            _log(f"[startup] crowd {label(k)} {m}: {procs} processes x {per} kernels ...")
            c = crowd(k, m, procs, per)
            crowds.append(c)
            _log(f"[startup] crowd {label(k)} {m}: {c['ok']}/{c['requested']} ok, wall {fmt(c.get('wall_all_exec'))}s")
    load["end"] = os.getloadavg()
    text = report(single, crowds, notes, args.reps, bases)
    text += wall_note("startup", time.monotonic() - t_begin, load)
    write_json(
        pathlib.Path(args.json), run_record(load, args.baseline, bases, single=single, crowd=crowds, notes=notes)
    )
    pathlib.Path(args.md).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    if os.environ.get("BENCH_START_METHOD"):
        mp.set_start_method(os.environ["BENCH_START_METHOD"])
    sys.exit(main())
