"""IOPub speed, trikernel vs ipykernel (and xeus-python when installed), in one run.

Measures, per kernel, with real kernels in subprocesses driven by jupyter_client:

(a) comm: comm_open messages/s of a cell creating N (20000) comms with
    ``comm.create_comm(target_name="bench")``; time from execute_request
    sent to the idle status received; comm_open messages counted (loss
    reported).
(b) stream: MB/s of a cell printing L (200000) lines of 60 characters;
    UTF-8 bytes of stream text received and the number of stream messages.
(c) burst: time to idle of the ipywidgets burst
    ``display(GridBox([Button(description=str(i)) for i in range(1000)]))``
    (3002 comm_open) over plain TCP and with CurveZMQ
    (``KernelManager(transport_encryption="required")``); one fresh kernel
    per trial; comm_open, display_data and idle counted.

(d) comm in: client -> kernel comm_msg/s. The client opens a comm (target
    ``bench_in``) and, once the kernel's target has answered, sends M
    (5000) ``comm_msg`` back to back on shell (signed before the clock
    starts, so the client's cost is one ``send_multipart`` each); the
    comm's ``on_msg`` appends ``(i, time.perf_counter())`` and, at the Mth,
    answers with a ``comm_msg`` carrying the span first -> last ``on_msg``
    and the count of out-of-order arrivals (an ``i`` lower than the one
    handled before it). Two rates: M / that span (in the kernel) and M /
    (first send -> the answer read on IOPub) (at the client).

(a), (b) and (d) run in one warm kernel per kernelspec after a small
warm-up; trials are interleaved across kernels. Reported: median (and
best) of the trials, trikernel / ipykernel ratios (and, with
``--baseline``, each trikernel / the first baseline), every loss. Nothing
is asserted.

``--baseline REV ...`` adds trikernel as of each git revision (``git
archive`` of ``trikernel/`` on ``sys.path``, bench/_common.py
``baseline_kernelspec``), next to the checkout's own, in (a), (b), (d)
and, unless ``--burst-reps 0``, (c).

Usage: python bench/iopub.py [--reps 3] [--kernels trikernel python3 xpython]
       [--comms 20000] [--lines 200000] [--comm-msgs 5000] [--buttons 1000]
       [--baseline REV ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import shutil
import sys
import tempfile
import time
import uuid
from typing import Any

import zmq

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import (
    RESULTS_DIR,
    CellRun,
    KernelCpu,
    available_kernels,
    baseline_kernelspecs,
    drain_iopub,
    fmt,
    kernel,
    kernel_spec_supports_curve,
    label,
    md_table,
    median,
    patched_kernelspec,
    quick_exec,
    ratio,
    run_cell,
    run_record,
    start_kernel,
    wall_note,
    with_baselines,
    write_json,
)

# Each timed cell also records, in the kernel, how long its own code ran
# (``_bench_dt``, returned through user_expressions): producer time, as
# opposed to the client-side time to idle.
TIMER_SETUP = "import time as _bench_time\n_bench_dt = 0.0"
T0 = "_bench_t0 = _bench_time.perf_counter()\n"
T1 = "\n_bench_dt = _bench_time.perf_counter() - _bench_t0"
UEXPR = {"dt": "_bench_dt"}
COMM_SETUP = "import comm\n_bench_comms = []"
COMM_CELL = T0 + "_bench_comms.append([comm.create_comm(target_name='bench') for _ in range({n})])" + T1
STREAM_SETUP = "_bench_line = 'x' * 60"
STREAM_CELL = T0 + "for _ in range({n}):\n    print(_bench_line)" + T1
BURST_SETUP = "from ipywidgets import Button, GridBox\nfrom IPython.display import display"
BURST_CELL = T0 + "display(GridBox([Button(description=str(i)) for i in range({n})]))" + T1
#: (d): the comm target the client opens; ``n`` comes in the comm_open's data.
COMM_IN_TARGET = "bench_in"
COMM_IN_SETUP = f"""
import comm as _bench_comm
_bench_in = {{}}
def _bench_in_target(c, open_msg):
    n = open_msg["content"]["data"]["n"]
    got = _bench_in[c.comm_id] = []
    def on_msg(msg):
        got.append((msg["content"]["data"]["i"], _bench_time.perf_counter()))
        if len(got) == n:
            late = sum(1 for a, b in zip(got, got[1:]) if b[0] < a[0])
            c.send({{"done": n, "span": got[-1][1] - got[0][1], "late": late}})
    c.on_msg(on_msg)
    c.send({{"ready": n}})
_bench_comm.get_comm_manager().register_target({COMM_IN_TARGET!r}, _bench_in_target)
"""


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _summ(run: CellRun) -> str:
    c = run.counts
    return (
        f"{run.elapsed:.3f}s comm_open={c.get('comm_open', 0)} stream={c.get('stream', 0)}"
        f"/{run.stream_bytes}B display_data={c.get('display_data', 0)} idle={run.got_idle}"
        f" reply={run.reply_status} code={run.user_expressions.get('dt', '?')[:6]}s"
        f" kernel_cpu={fmt(run.kernel_cpu)}s client_cpu={run.client_cpu:.2f}s {run.note}"
    )


# -- (d): client -> kernel comm_msg --------------------------------------------


def _wait_comm_msg(kc: Any, comm_id: str, key: str, timeout: float) -> dict[str, Any] | None:
    """Read IOPub raw until a comm_msg of ``comm_id`` whose data has ``key``; its data, or None
    after ``timeout`` s. Only comm_msg contents are parsed (the N busy/idle pairs are skipped
    by their header)."""
    sock = kc.iopub_channel.socket
    cid = comm_id.encode()
    deadline = time.perf_counter() + timeout
    while True:
        left = deadline - time.perf_counter()
        if left <= 0 or not sock.poll(max(1, int(left * 1000))):
            return None
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            parts = frames[frames.index(b"<IDS|MSG>") + 1 :]
            if b'"comm_msg"' not in parts[1] or cid not in parts[4]:
                continue
            content = json.loads(parts[4])
            if content.get("comm_id") == comm_id and key in (content.get("data") or {}):
                return dict(content["data"])


def comm_in_trial(k: Any, n: int, timeout: float = 120.0, ready_timeout: float = 30.0) -> dict[str, Any]:
    """One (d) trial on kernel ``k``: open a fresh comm, send ``n`` comm_msg, wait for the answer.

    Returns ``ok``, ``client_s`` (first send -> the answer read), ``send_s`` (first -> last
    send returned), ``kernel_span_s`` (first -> last ``on_msg``, in the kernel), ``late``
    (out-of-order arrivals), ``handled`` (when no answer came: how many the kernel had),
    kernel and client CPU seconds (psutil, process_time) and a ``note``.
    """
    kc = k.kc
    session = kc.session
    shell = kc.shell_channel.socket
    cid = uuid.uuid4().hex
    res: dict[str, Any] = {"ok": False, "n": n, "note": ""}
    drain_iopub(kc)
    session.send(shell, "comm_open", {"comm_id": cid, "target_name": COMM_IN_TARGET, "data": {"n": n}})
    if _wait_comm_msg(kc, cid, "ready", ready_timeout) is None:
        res["note"] = "the comm target never answered the comm_open"
        return res
    msgs = [session.serialize(session.msg("comm_msg", {"comm_id": cid, "data": {"i": i}})) for i in range(n)]
    kernel_cpu = KernelCpu(k.pid)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for frames in msgs:
        shell.send_multipart(frames)
    res["send_s"] = time.perf_counter() - t0
    done = _wait_comm_msg(kc, cid, "done", timeout)
    res["client_s"] = time.perf_counter() - t0
    res["client_cpu"] = time.process_time() - cpu0
    used = kernel_cpu.used()
    if used is not None:
        res["kernel_cpu"] = used
    if done is None:
        res["note"] = f"no answer within {timeout:.0f}s"
        r = run_cell(kc, "pass", user_expressions={"n": f"len(_bench_in.get({cid!r}, ()))"})
        res["handled"] = r.user_expressions.get("n")
    else:
        res["ok"] = True
        res["kernel_span_s"] = float(done["span"])
        res["late"] = int(done["late"])
        res["handled"] = int(done["done"])
    session.send(shell, "comm_close", {"comm_id": cid, "data": {}})
    return res


def _summ_in(r: dict[str, Any]) -> str:
    return (
        f"client {fmt(r.get('client_s'), 3)}s (sends {fmt(r.get('send_s'), 3)}s) kernel span "
        f"{fmt(r.get('kernel_span_s'), 3)}s late={r.get('late')} handled={r.get('handled')}/{r['n']} "
        f"kernel_cpu={fmt(r.get('kernel_cpu'))}s client_cpu={fmt(r.get('client_cpu'))}s {r['note']}"
    )


# -- (a) + (b) + (d): warm kernels ---------------------------------------------


def bench_throughput(kernels: list[str], reps: int, n_comms: int, n_lines: int, n_in: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {k: {"comm": [], "stream": [], "comm_in": [], "errors": []} for k in kernels}
    live = {}
    comm_in: list[str] = []  # the kernels whose comm in warm-up worked
    for name in kernels:
        try:
            k = start_kernel(name, log_tag="-throughput")
            quick_exec(k.kc, TIMER_SETUP)
            quick_exec(k.kc, COMM_SETUP)
            quick_exec(k.kc, STREAM_SETUP)
            quick_exec(k.kc, COMM_IN_SETUP)
            # warm-up: small versions of every cell
            run_cell(k.kc, COMM_CELL.format(n=1000), timeout=60)
            run_cell(k.kc, STREAM_CELL.format(n=10000), timeout=60)
            if n_in:
                w = comm_in_trial(k, min(n_in, 500), timeout=60, ready_timeout=10)
                if w["ok"]:
                    comm_in.append(name)
                else:  # e.g. xeus-python 0.19: a frontend comm_open never reaches a Python target
                    out[name]["errors"].append(
                        f"comm in warm-up failed, no comm in trials: {_summ_in(w)}; log tail:\n{k.log_tail()}"
                    )
            live[name] = k
        except Exception as exc:  # a bench reports any failure and goes on
            out[name]["errors"].append(f"start/warm-up failed: {exc!r}")
            _log(f"[iopub] {name}: start/warm-up failed: {exc!r}")
    try:
        for rep in range(reps):
            for name, k in live.items():
                r = run_cell(k.kc, COMM_CELL.format(n=n_comms), timeout=180, kernel_pid=k.pid, user_expressions=UEXPR)
                out[name]["comm"].append(r.as_dict())
                _log(f"[iopub] comm   {label(name):12} rep {rep + 1}: {_summ(r)}")
                if not r.got_idle:
                    out[name]["errors"].append(f"comm rep {rep + 1}: {r.note}; log tail:\n{k.log_tail()}")
            for name, k in live.items():
                r = run_cell(k.kc, STREAM_CELL.format(n=n_lines), timeout=180, kernel_pid=k.pid, user_expressions=UEXPR)
                out[name]["stream"].append(r.as_dict())
                _log(f"[iopub] stream {label(name):12} rep {rep + 1}: {_summ(r)}")
                if not r.got_idle:
                    out[name]["errors"].append(f"stream rep {rep + 1}: {r.note}; log tail:\n{k.log_tail()}")
            for name, k in live.items():
                if name not in comm_in:
                    continue
                ri = comm_in_trial(k, n_in)
                out[name]["comm_in"].append(ri)
                _log(f"[iopub] comm in {label(name):11} rep {rep + 1}: {_summ_in(ri)}")
                if not ri["ok"] or ri.get("late"):
                    out[name]["errors"].append(f"comm in rep {rep + 1}: {_summ_in(ri)}; log tail:\n{k.log_tail()}")
    finally:
        for k in live.values():
            k.shutdown()
    return out


# -- (c): widget burst, fresh kernel per trial ----------------------------------


def _kernel_info_answered(km: Any, *, with_key: bool, wait: float) -> bool | None:
    """Send one kernel_info_request on a fresh DEALER to the shell port.

    ``with_key``: act as a CURVE client with the kernel's public key
    (``km.curve_publickey``); otherwise a plain (NULL mechanism) client.
    True if a reply came within ``wait`` s, False if not, None if the
    port is unknown. The send is non-blocking (a DEALER whose peer never
    completes the handshake would block a plain send forever).
    """
    info = km.get_connection_info()
    if "shell_port" not in info:
        return None
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.sndtimeo = 0  # sends raise zmq.Again instead of blocking
    try:
        if with_key:
            pub, sec = zmq.curve_keypair()
            s.curve_publickey, s.curve_secretkey = pub, sec
            s.curve_serverkey = km.curve_publickey
        s.connect(f"tcp://{info['ip']}:{info['shell_port']}")
        msg = km.session.msg("kernel_info_request", {})
        end = time.monotonic() + wait
        while True:
            try:
                km.session.send(s, msg)
                break
            except zmq.Again:
                if time.monotonic() > end:
                    return False
                time.sleep(0.05)
        return bool(s.poll(max(0, int((end - time.monotonic()) * 1000))))
    finally:
        s.close(0)


def plain_client_refused(k: Any, wait: float = 1.5) -> bool | None:
    """True if a client WITHOUT the server key gets no reply (CURVE enforced)."""
    answered = _kernel_info_answered(k.km, with_key=False, wait=wait)
    return None if answered is None else not answered


def bench_burst(kernels: list[str], reps: int, n_buttons: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    modes = ["tcp", "curve"]
    for name in kernels:
        out[name] = {m: [] for m in modes}
        out[name]["errors"] = []
        out[name]["curve_supported"] = kernel_spec_supports_curve(name)
        out[name]["curve_enforced"] = None
    for rep in range(reps):
        for mode in modes:
            for name in kernels:
                if mode == "curve" and not out[name]["curve_supported"]:
                    continue
                tag = f"-burst-{mode}-{rep + 1}"
                try:
                    with kernel(name, encryption=(mode == "curve"), log_tag=tag) as k:
                        quick_exec(k.kc, TIMER_SETUP)
                        quick_exec(k.kc, BURST_SETUP)
                        r = run_cell(
                            k.kc, BURST_CELL.format(n=n_buttons), timeout=120, kernel_pid=k.pid, user_expressions=UEXPR
                        )
                        if mode == "curve" and out[name]["curve_enforced"] is None:
                            out[name]["curve_enforced"] = plain_client_refused(k)
                        if not r.got_idle or r.counts.get("comm_open", 0) != 3 * n_buttons + 2:
                            out[name]["errors"].append(
                                f"burst {mode} trial {rep + 1}: {_summ(r)}; log tail:\n{k.log_tail()}"
                            )
                    out[name][mode].append(r.as_dict())
                    _log(f"[iopub] burst-{mode:5} {label(name):12} trial {rep + 1}: {_summ(r)}")
                except Exception as exc:  # a bench reports any failure and goes on
                    out[name]["errors"].append(f"burst {mode} trial {rep + 1}: {exc!r}")
                    _log(f"[iopub] burst-{mode} {name} trial {rep + 1}: FAILED {exc!r}")
    return out


def probe_curve_ignored(name: str) -> str:
    """For a kernelspec without ``supported_encryption``: copy it with the
    metadata added, start it with transport_encryption="required" and see
    whether the kernel honours the keys (raw sockets, non-blocking sends:
    jupyter_client's ``wait_for_ready`` blocks forever in a send when the
    CURVE handshake never completes)."""
    from _common import LOG_DIR
    from jupyter_client import KernelManager

    try:
        with patched_kernelspec(name, name + "-curveprobe", {"supported_encryption": ["curve"]}) as ksm:
            km = KernelManager(
                kernel_name=name + "-curveprobe", kernel_spec_manager=ksm, transport_encryption="required"
            )
            LOG_DIR.mkdir(parents=True, exist_ok=True)
            with open(LOG_DIR / f"{name}-curveprobe.log", "w") as log:
                km.start_kernel(stdout=log, stderr=log)
                try:
                    time.sleep(2.0)
                    enc = _kernel_info_answered(km, with_key=True, wait=8.0)
                    plain = _kernel_info_answered(km, with_key=False, wait=3.0)
                finally:
                    km.shutdown_kernel(now=True)
            return (
                'temp kernelspec copy with `supported_encryption: ["curve"]`, started with '
                f'transport_encryption="required": client WITH the key '
                f"{'answered' if enc else 'got NO reply (CURVE handshake never completes)'}; client WITHOUT "
                f"the key {'answered (the kernel ignores the keys, traffic is plaintext)' if plain else 'got no reply'}"
            )
    except Exception as exc:  # a bench reports any failure and goes on
        return f"probe failed: {exc!r}"


# -- report ------------------------------------------------------------------


def _col(runs: list[dict[str, Any]], f: Any) -> list[float]:
    return [f(r) for r in runs if r.get("got_idle")]


def _dt(r: dict[str, Any]) -> float:
    try:
        return float(r.get("user_expressions", {}).get("dt", "nan"))
    except ValueError:
        return float("nan")


def _diag(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {
        "idle": median(_col(runs, lambda r: r["elapsed"])),
        "code": median(_col(runs, _dt)),
        "kernel_cpu": median(
            _col(runs, lambda r: r["kernel_cpu"] if r.get("kernel_cpu") is not None else float("nan"))
        ),
        "client_cpu": median(_col(runs, lambda r: r["client_cpu"])),
    }


def summarise(thr: dict[str, Any], burst: dict[str, Any], kernels: list[str], args: Any) -> dict[str, Any]:
    s: dict[str, Any] = {}
    for name in kernels:
        t = thr.get(name, {})
        b = burst.get(name, {})
        comm = t.get("comm", [])
        stream = t.get("stream", [])
        d: dict[str, Any] = {}
        rates = _col(comm, lambda r: r["counts"].get("comm_open", 0) / r["elapsed"])
        d["comm_rate_median"] = median(rates)
        d["comm_rate_best"] = max(rates) if rates else float("nan")
        d["comm_elapsed_median"] = median(_col(comm, lambda r: r["elapsed"]))
        d["comm_received"] = [r["counts"].get("comm_open", 0) for r in comm]
        d["comm_idle"] = [r["got_idle"] for r in comm]
        d["comm_client_cpu_share"] = median(_col(comm, lambda r: r["client_cpu"] / r["elapsed"]))
        mbs = _col(stream, lambda r: r["stream_bytes"] / r["elapsed"] / 1e6)
        d["stream_mbs_median"] = median(mbs)
        d["stream_mbs_best"] = max(mbs) if mbs else float("nan")
        d["stream_elapsed_median"] = median(_col(stream, lambda r: r["elapsed"]))
        d["stream_bytes"] = [r["stream_bytes"] for r in stream]
        d["stream_messages"] = [r["counts"].get("stream", 0) for r in stream]
        d["stream_idle"] = [r["got_idle"] for r in stream]
        d["stream_client_cpu_share"] = median(_col(stream, lambda r: r["client_cpu"] / r["elapsed"]))
        cin = [r for r in t.get("comm_in", []) if r.get("ok")]
        kin = [r["n"] / r["kernel_span_s"] for r in cin if r["kernel_span_s"] > 0]
        cli = [r["n"] / r["client_s"] for r in cin]
        d["comm_in_kernel_rate_median"] = median(kin)
        d["comm_in_kernel_rate_best"] = max(kin, default=float("nan"))
        d["comm_in_client_rate_median"] = median(cli)
        d["comm_in_client_rate_best"] = max(cli, default=float("nan"))
        d["comm_in_late"] = [r.get("late") for r in t.get("comm_in", [])]
        d["comm_in_handled"] = [r.get("handled") for r in t.get("comm_in", [])]
        d["comm_in_client_cpu_share"] = median([r["client_cpu"] / r["client_s"] for r in cin])
        d["comm_in_kernel_cpu"] = median([r["kernel_cpu"] for r in cin if "kernel_cpu" in r])
        for mode in ("tcp", "curve"):
            runs = b.get(mode, [])
            d[f"burst_{mode}_median"] = median(_col(runs, lambda r: r["elapsed"]))
            d[f"burst_{mode}_best"] = min(_col(runs, lambda r: r["elapsed"]), default=float("nan"))
            d[f"burst_{mode}_comm_open"] = [r["counts"].get("comm_open", 0) for r in runs]
            d[f"burst_{mode}_display_data"] = [r["counts"].get("display_data", 0) for r in runs]
            d[f"burst_{mode}_idle"] = [r["got_idle"] for r in runs]
            d[f"burst_{mode}_trials"] = len(runs)
        d["diag"] = {
            "comm": _diag(comm),
            "stream": _diag(stream),
            "burst TCP": _diag(b.get("tcp", [])),
            "burst CURVE": _diag(b.get("curve", [])),
        }
        d["curve_supported"] = b.get("curve_supported")
        d["curve_enforced"] = b.get("curve_enforced")
        d["curve_probe"] = b.get("curve_probe")
        d["errors"] = t.get("errors", []) + b.get("errors", [])
        s[name] = d
    return s


def _pct(share: float) -> str:
    """``share`` (0..1) as a percentage; n/a when there was no trial."""
    return "n/a" if math.isnan(share) else f"{share * 100:.0f}%"


def _loss(received: list[int], expected: int, idle: list[bool]) -> str:
    if not received:
        return "n/a"
    lost = [expected - r for r in received]
    noidle = sum(1 for i in idle if not i)
    txt = "none" if not any(lost) else f"lost {', '.join(str(x) for x in lost)}"
    if noidle:
        txt += f"; idle missing in {noidle}/{len(idle)}"
    return f"{min(received)}/{expected} min ({txt})"


def report(s: dict[str, Any], kernels: list[str], args: Any) -> str:
    tri, ipk = s.get("trikernel"), s.get("python3")
    bases = [b for b in args.bases if b in s]
    # with --baseline: each trikernel (the checkout's, the later baselines) over the first baseline
    vs_base = [k for k in kernels if k == "trikernel" or k in bases[1:]] if bases else []
    headers = (
        ["metric"]
        + [label(k) for k in kernels]
        + ["trikernel / ipykernel"]
        + [f"{label(k)} / {label(bases[0])}" for k in vs_base]
        + ["target"]
    )
    expected_stream = args.lines * 61

    def row(name: str, key: str, digits: int = 2, scale: float = 1.0, target: str = "") -> list[str]:
        vals = [s[k].get(key) for k in kernels]
        cells = [fmt(v * scale if isinstance(v, (int, float)) and not math.isnan(v) else v, digits) for v in vals]
        r = ratio(tri.get(key) if tri else None, ipk.get(key) if ipk else None)
        rb = [ratio(s[k].get(key), s[bases[0]].get(key)) for k in vs_base]
        return [name, *cells, r, *rb, target]

    rows = [
        row(f"comm_open msg/s, {args.comms} comms (median)", "comm_rate_median", target=">= 3x"),
        row("comm_open msg/s (best)", "comm_rate_best"),
        row(f"stream MB/s, {args.lines} x 60-char lines (median)", "stream_mbs_median", target=">= 2x"),
        row("stream MB/s (best)", "stream_mbs_best"),
    ]
    if args.comm_msgs:
        rows += [
            row(f"comm_msg in msg/s, {args.comm_msgs} sent, in the kernel (median)", "comm_in_kernel_rate_median"),
            row("comm_msg in msg/s, in the kernel (best)", "comm_in_kernel_rate_best"),
            row("comm_msg in msg/s, first send -> all handled, at the client (median)", "comm_in_client_rate_median"),
            row("comm_msg in msg/s, at the client (best)", "comm_in_client_rate_best"),
        ]
    if args.burst_reps:
        rows += [
            row(
                f"burst {args.buttons} buttons, TCP: ms to idle (median)",
                "burst_tcp_median",
                0,
                1000,
                "lower is better",
            ),
            row(f"burst {args.buttons} buttons, CURVE: ms to idle (median)", "burst_curve_median", 0, 1000),
        ]
        rows.append(
            ["burst CURVE / TCP time (same kernel)"]
            + [ratio(s[k].get("burst_curve_median"), s[k].get("burst_tcp_median")) for k in kernels]
            + [""] * (1 + len(vs_base))
            + ["trikernel <= 1.1x"]
        )
    main = md_table(headers, rows)

    lrows = []
    for k in kernels:
        d = s[k]
        n_exp = 3 * args.buttons + 2
        curve = (
            _loss(d["burst_curve_comm_open"], n_exp, d["burst_curve_idle"])
            if d["burst_curve_trials"]
            else ("n/a (kernelspec declares no curve)" if not d["curve_supported"] else "n/a (no trial)")
        )
        lrows.append(
            [
                label(k),
                _loss(d["comm_received"], args.comms, d["comm_idle"]),
                _loss(d["stream_bytes"], expected_stream, d["stream_idle"]),
                ", ".join(str(x) for x in d["stream_messages"]) or "n/a",
                _loss(d["burst_tcp_comm_open"], n_exp, d["burst_tcp_idle"])
                + f"; display_data {sum(d['burst_tcp_display_data'])}/{d['burst_tcp_trials']}",
                curve
                + (
                    f"; display_data {sum(d['burst_curve_display_data'])}/{d['burst_curve_trials']}"
                    if d["burst_curve_trials"]
                    else ""
                ),
                {True: "yes", False: "NO (keys ignored)", None: "n/a"}[d["curve_enforced"]],
            ]
        )
        lrows[-1].append(
            ", ".join(
                f"{h}/{args.comm_msgs} handled, {late} late"
                for h, late in zip(d["comm_in_handled"], d["comm_in_late"], strict=True)
            )
            or "n/a"
        )
    loss = md_table(
        [
            "kernel",
            "comm_open received",
            "stream bytes received",
            "stream messages per trial",
            "burst TCP comm_open",
            "burst CURVE comm_open",
            "CURVE enforced",
            "comm_msg in, per trial (late: out of order)",
        ],
        lrows,
    )
    cpu = md_table(
        [
            "kernel",
            "client CPU share, comm cell",
            "client CPU share, stream cell",
            "client CPU share, comm_msg in",
            "kernel CPU s, comm_msg in",
        ],
        [
            [
                label(k),
                _pct(s[k]["comm_client_cpu_share"]),
                _pct(s[k]["stream_client_cpu_share"]),
                _pct(s[k]["comm_in_client_cpu_share"]),
                fmt(s[k]["comm_in_kernel_cpu"], 2),
            ]
            for k in kernels
        ],
    )
    drows = []
    for k in kernels:
        for cell, dg in s[k]["diag"].items():
            if dg["idle"] == dg["idle"]:
                drows.append(
                    [
                        label(k),
                        cell,
                        fmt(dg["idle"], 3),
                        fmt(dg["code"], 3),
                        fmt(dg["kernel_cpu"], 2),
                        fmt(dg["client_cpu"], 2),
                    ]
                )
    diag = md_table(
        ["kernel", "cell", "s to idle", "s in cell code (kernel-side)", "kernel CPU s", "client CPU s"], drows
    )
    parts = [
        "### IOPub throughput",
        "",
        main,
        "",
        "Delivery (every trial counted; expected counts after the slash):",
        "",
        loss,
        "",
        "Client CPU seconds / wall seconds during the cell (the client must not be the bottleneck):",
        "",
        cpu,
        "",
        (
            "Where the time goes (medians): time to idle seen by the client; time the cell's own code ran in the "
            "kernel (perf_counter around the loop, returned via user_expressions); CPU seconds of the kernel "
            "process and of the client meanwhile:"
        ),
        "",
        diag,
    ]
    probes = [f"- {label(k)}: {s[k]['curve_probe']}" for k in kernels if s[k].get("curve_probe")]
    if probes:
        parts += ["", "CURVE probe for kernelspecs without `supported_encryption`:", "", *probes]
    errs = [(k, e) for k in kernels for e in s[k]["errors"]]
    if errs:
        parts += ["", "Anomalies:", ""]
        for k, e in errs:
            parts.append(f"- {label(k)}: " + e.replace("\n", "\n    "))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--burst-reps", type=int, default=5, help="fresh-kernel trials per burst mode and kernel")
    p.add_argument("--kernels", nargs="*", default=None)
    p.add_argument("--comms", type=int, default=20000)
    p.add_argument("--lines", type=int, default=200000)
    p.add_argument("--comm-msgs", type=int, default=5000, help="(d): comm_msg sent to the kernel per trial; 0 skips")
    p.add_argument("--buttons", type=int, default=1000)
    p.add_argument("--baseline", nargs="*", default=[], help="git revisions of trikernel to compare with")
    p.add_argument("--no-probe", action="store_true", help="skip the CURVE probe of kernelspecs without curve")
    p.add_argument("--json", default=str(RESULTS_DIR / "iopub.json"))
    p.add_argument("--md", default=str(RESULTS_DIR / "iopub.md"))
    args = p.parse_args(argv)
    root = pathlib.Path(tempfile.mkdtemp(prefix="bench-iopub-"))
    try:
        args.bases = baseline_kernelspecs(args.baseline, root)
        kernels = with_baselines(available_kernels(args.kernels), args.bases)
        _log(f"[iopub] kernels: {', '.join(kernels)}")
        t0 = time.monotonic()
        load = {"start": os.getloadavg()}
        thr = bench_throughput(kernels, args.reps, args.comms, args.lines, args.comm_msgs)
        burst = bench_burst(kernels, args.burst_reps, args.buttons)
        if not args.no_probe:
            for name in kernels:
                if not burst[name]["curve_supported"]:
                    burst[name]["curve_probe"] = probe_curve_ignored(name)
                    _log(f"[iopub] curve probe {name}: {burst[name]['curve_probe']}")
        load["end"] = os.getloadavg()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    s = summarise(thr, burst, kernels, args)
    text = report(s, kernels, args)
    text += wall_note("iopub", time.monotonic() - t0, load)
    write_json(
        pathlib.Path(args.json),
        run_record(
            load,
            args.baseline,
            args.bases,
            raw={"throughput": thr, "burst": burst},
            summary=s,
        ),
    )
    pathlib.Path(args.md).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
