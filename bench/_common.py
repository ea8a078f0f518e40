"""Shared helpers of the bench scripts: start kernels, run cells, count IOPub, print tables.

Every bench drives real kernels in subprocesses through jupyter_client
(``KernelManager`` + ``BlockingKernelClient``) on loopback. The IOPub
counting reads the client's own SUB socket (``kc.iopub_channel.socket``)
with ``recv_multipart`` and parses only the header and parent header of
each message (plus the content of ``stream`` / ``status`` messages), so
the client's per-message cost stays small next to the kernel's and the
measured rate is the kernel's, not jupyter_client's deserialiser's. The
client's own CPU time is reported with every run so that this can be
checked (the machine has 2 cores; kernel and client share them).

Figures are reported, never asserted.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import zmq

VENV_BIN = str(pathlib.Path(sys.executable).parent)
# xpython's kernelspec names "python3.11" in argv; make sure that is ours.
if not os.environ.get("PATH", "").startswith(VENV_BIN + os.pathsep):
    os.environ["PATH"] = VENV_BIN + os.pathsep + os.environ.get("PATH", "")

from jupyter_client import KernelManager  # noqa: E402 - after PATH names this venv, above
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

BENCH_DIR = pathlib.Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
REPO_ROOT = BENCH_DIR.parent
LOG_DIR = RESULTS_DIR / "logs"

#: Display order and labels of the kernels compared.
KERNELS = {"trikernel": "trikernel", "python3": "ipykernel", "xpython": "xeus-python"}
DELIM = b"<IDS|MSG>"


def label(kernel_name: str) -> str:
    return KERNELS.get(kernel_name, kernel_name)


def available_kernels(wanted: Sequence[str] | None = None) -> list[str]:
    """Kernelspecs of ``wanted`` (default: all of KERNELS) that exist here."""
    specs = KernelSpecManager().find_kernel_specs()
    return [k for k in (wanted or list(KERNELS)) if k in specs]


def kernel_spec_supports_curve(kernel_name: str) -> bool:
    try:
        spec = KernelSpecManager().get_kernel_spec(kernel_name)
    except NoSuchKernel:
        return False
    return "curve" in (spec.metadata or {}).get("supported_encryption", [])


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "libzmq": zmq.zmq_version()}
    for dist in ("trikernel", "ipykernel", "xeus-python", "jupyter_client", "pyzmq", "ipywidgets", "trio", "comm"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[dist] = md.version(dist)
    return out


def machine() -> str:
    cpu = "unknown cpu"
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(Exception):
        import psutil

        mem = f", {psutil.virtual_memory().total / 2**30:.0f} GiB RAM"
    return f"{os.cpu_count()} cores ({cpu}){mem}, {platform.system()} {platform.release()}"


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


# -- kernels ---------------------------------------------------------------


@dataclass
class Kernel:
    name: str
    km: KernelManager
    kc: Any
    log_path: pathlib.Path | None
    _log_file: Any = None

    @property
    def pid(self) -> int | None:
        proc = getattr(self.km.provisioner, "process", None)
        return getattr(proc, "pid", None)

    def log_tail(self, n: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        if self._log_file is not None:
            with contextlib.suppress(Exception):
                self._log_file.flush()
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self.kc.stop_channels()
        try:
            self.km.shutdown_kernel(now=False)
        except Exception:  # a bench reports any failure and goes on
            with contextlib.suppress(Exception):
                self.km.shutdown_kernel(now=True)
        if self._log_file is not None:
            with contextlib.suppress(Exception):
                self._log_file.close()


def start_kernel(
    name: str,
    *,
    encryption: bool = False,
    log_tag: str = "",
    ready_timeout: float = 60.0,
    kernel_spec_manager: KernelSpecManager | None = None,
) -> Kernel:
    """Start kernelspec ``name`` classic-way (default provisioner) and wait until it answers.

    ``encryption``: ``transport_encryption="required"`` (jupyter_client 8.10
    provisions CurveZMQ keys; raises RuntimeError for kernelspecs that do
    not declare ``supported_encryption: ["curve"]``). The kernel's stdout
    and stderr go to ``bench/results/logs/<name><log_tag>.log``.
    """
    kw: dict[str, Any] = {"kernel_name": name}
    if encryption:
        kw["transport_encryption"] = "required"
    if kernel_spec_manager is not None:
        kw["kernel_spec_manager"] = kernel_spec_manager
    km = KernelManager(**kw)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / f"{name}{log_tag}.log"
    log_file = open(log_path, "w")  # noqa: SIM115 - closed in Kernel.shutdown
    km.start_kernel(stdout=log_file, stderr=log_file)
    kc = km.client()
    kc.start_channels(hb=False)
    try:
        kc.wait_for_ready(timeout=ready_timeout)
    except Exception:
        k = Kernel(name, km, kc, log_path, log_file)
        k.shutdown()
        raise
    return Kernel(name, km, kc, log_path, log_file)


@contextlib.contextmanager
def kernel(name: str, **kw: Any) -> Iterator[Kernel]:
    k = start_kernel(name, **kw)
    try:
        yield k
    finally:
        k.shutdown()


# -- running a cell and counting IOPub ----------------------------------------


def _split(frames: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    i = frames.index(DELIM)
    return frames[:i], frames[i + 1 :]


@dataclass
class CellRun:
    """What the client saw for one execute_request."""

    code: str
    elapsed: float = 0.0  #: execute sent -> idle received (or -> give-up if no idle)
    counts: Counter[str] = field(default_factory=Counter)
    stream_bytes: int = 0  #: UTF-8 bytes of stream text
    got_idle: bool = False
    reply_status: str | None = None
    reply_elapsed: float | None = None  #: execute sent -> execute_reply
    client_cpu: float = 0.0  #: CPU seconds of this (client) process meanwhile
    timed_out: bool = False
    note: str = ""
    kernel_cpu: float | None = None  #: CPU seconds of the kernel process meanwhile (psutil)
    user_expressions: dict[str, str] = field(default_factory=dict)  #: name -> text/plain

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["counts"] = dict(self.counts)
        return d


def drain_iopub(kc: Any, quiet: float = 0.2) -> int:
    """Discard IOPub until ``quiet`` seconds pass without a message; return how many."""
    sock = kc.iopub_channel.socket
    n = 0
    while sock.poll(int(quiet * 1000)):
        sock.recv_multipart()
        n += 1
    return n


def run_cell(
    kc: Any,
    code: str,
    *,
    timeout: float = 120.0,
    idle_grace: float = 3.0,
    on_poll: Any = None,
    poll_ms: int = 50,
    kernel_pid: int | None = None,
    user_expressions: dict[str, str] | None = None,
) -> CellRun:
    """Execute ``code`` and read IOPub until its idle status.

    Gives up ``idle_grace`` seconds after the execute_reply if no idle has
    arrived (lost idle), or after ``timeout`` seconds in any case. Counts
    every IOPub message whose parent is this request, by msg_type.
    ``on_poll`` (optional) is called about every ``poll_ms`` ms while waiting.
    ``kernel_pid``: also report the kernel process's CPU seconds (psutil).
    ``user_expressions``: evaluated by the kernel after the cell; their
    text/plain values land in ``CellRun.user_expressions``.
    """
    drain_iopub(kc)
    iopub = kc.iopub_channel.socket
    shell = kc.shell_channel.socket
    poller = zmq.Poller()
    poller.register(iopub, zmq.POLLIN)
    poller.register(shell, zmq.POLLIN)
    run = CellRun(code=code)
    loads = json.loads
    kernel_cpu = KernelCpu(kernel_pid)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    msg_id = kc.execute(code, store_history=False, user_expressions=user_expressions or {})
    mid = msg_id.encode()
    deadline = t0 + timeout
    reply_at: float | None = None
    counts = run.counts
    while True:
        now = time.perf_counter()
        if now > deadline:
            run.timed_out = True
            run.note = f"no idle within {timeout:.0f}s"
            break
        if reply_at is not None and now - reply_at > idle_grace:
            run.note = f"execute_reply arrived but no idle within {idle_grace:.0f}s after it"
            break
        events = dict(poller.poll(poll_ms))
        if on_poll is not None:
            on_poll()
        if shell in events:
            while shell.poll(0):
                _, parts = _split(shell.recv_multipart())
                if mid in parts[2] and loads(parts[2]).get("msg_id") == msg_id:
                    _take_reply(run, loads(parts[4]))
                    reply_at = time.perf_counter()
                    run.reply_elapsed = reply_at - t0
        if iopub in events:
            done = False
            # drain everything available before polling again
            while True:
                try:
                    frames = iopub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                _, parts = _split(frames)
                # parts: hmac, header, parent_header, metadata, content, buffers...
                if mid not in parts[2]:
                    continue
                header = loads(parts[1])
                mtype = header["msg_type"]
                counts[mtype] += 1
                if mtype == "stream":
                    run.stream_bytes += len(loads(parts[4])["text"].encode())
                elif mtype == "status" and b'"idle"' in parts[4]:
                    run.got_idle = True
                    run.elapsed = time.perf_counter() - t0
                    done = True
                    break
            if done:
                break
    if not run.got_idle:
        run.elapsed = time.perf_counter() - t0
    run.client_cpu = time.process_time() - cpu0
    run.kernel_cpu = kernel_cpu.used()
    if run.reply_status is None:
        # collect the reply if it is still coming
        end = time.perf_counter() + 2.0
        while run.reply_status is None and time.perf_counter() < end:
            if shell.poll(100):
                _, parts = _split(shell.recv_multipart())
                if loads(parts[2]).get("msg_id") == msg_id:
                    _take_reply(run, loads(parts[4]))
                    run.reply_elapsed = time.perf_counter() - t0
    return run


def _take_reply(run: CellRun, content: dict[str, Any]) -> None:
    run.reply_status = content.get("status")
    for name, value in (content.get("user_expressions") or {}).items():
        if isinstance(value, dict):
            run.user_expressions[name] = str((value.get("data") or {}).get("text/plain", value.get("evalue", "")))


def quick_exec(kc: Any, code: str, timeout: float = 60.0) -> CellRun:
    run = run_cell(kc, code, timeout=timeout)
    if run.reply_status != "ok":
        raise RuntimeError(f"setup cell failed ({run.reply_status}, {run.note}): {code!r}")
    return run


# -- temp kernelspecs ---------------------------------------------------------


@contextlib.contextmanager
def patched_kernelspec(name: str, new_name: str, metadata_update: dict[str, Any]) -> Iterator[KernelSpecManager]:
    """A KernelSpecManager that sees a copy of kernelspec ``name`` as ``new_name`` with extra metadata."""
    src = KernelSpecManager().get_kernel_spec(name)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-kspec-"))
    try:
        dst = tmp / new_name
        shutil.copytree(src.resource_dir, dst)
        spec = json.loads((dst / "kernel.json").read_text())
        spec.setdefault("metadata", {}).update(metadata_update)
        (dst / "kernel.json").write_text(json.dumps(spec, indent=1))
        yield KernelSpecManager(kernel_dirs=[str(tmp)])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- statistics and tables ---------------------------------------------------


class KernelCpu:
    """The CPU seconds (user + system) a kernel process spends from now on.

    ``used()`` gives them, or None when psutil is missing or the process is
    gone (then, or if ``pid`` is None, nothing is measured)."""

    def __init__(self, pid: int | None):
        self._proc: Any = None
        self._start = 0.0
        if pid is None:
            return
        try:
            import psutil

            self._proc = psutil.Process(pid)
            ct = self._proc.cpu_times()
            self._start = ct.user + ct.system
        except (ImportError, OSError, psutil_error()):
            self._proc = None

    def used(self) -> float | None:
        if self._proc is None:
            return None
        try:
            ct = self._proc.cpu_times()
        except (OSError, psutil_error()):
            return None  # the kernel exited meanwhile
        return float(ct.user + ct.system - self._start)


def run_record(load: dict[str, Any], revs: Sequence[str], bases: Sequence[str], **parts: Any) -> dict[str, Any]:
    """What a bench script writes to its ``--json``: versions, machine, the load
    at start and end, the ``--baseline`` revisions and their kernel names, and ``parts``."""
    return {
        "versions": versions(),
        "machine": machine(),
        "load": load,
        "baselines": dict(zip(revs, bases, strict=True)),
        **parts,
    }


def wall_note(script: str, seconds: float, load: dict[str, Any]) -> str:
    """The line a bench report ends with: its wall time, the load at its start and end, the machine."""
    return (
        f"\n\n({script} bench wall time {seconds:.0f} s; load average at start"
        f" {load['start'][0]:.2f}, at end {load['end'][0]:.2f}; {machine()})\n"
    )


def psutil_error() -> type[Exception]:
    """psutil.Error if psutil is installed, else a class nothing raises."""
    try:
        import psutil
    except ImportError:
        return LookupError
    return psutil.Error


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def fmt(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    out = []
    for j, r in enumerate(cells):
        out.append("| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(r)) + " |")
        if j == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def write_json(path: pathlib.Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))


def _trikernel_python_flags() -> list[str]:
    """The interpreter flags of the installed ``trikernel`` kernelspec (those between the
    interpreter and ``-m``, e.g. ``-Xfrozen_modules=off``), so that a baseline starts the way
    the checkout's kernel does; [] if there is no such kernelspec."""
    try:
        argv = KernelSpecManager().get_kernel_spec("trikernel").argv
    except NoSuchKernel:
        return []
    return list(argv[1 : argv.index("-m")]) if "-m" in argv else []


def baseline_kernelspec(rev: str, root: pathlib.Path) -> str:
    """A kernelspec that runs trikernel as of git revision ``rev``; returns its name.

    ``git archive`` of ``trikernel/`` into ``root/src-SHORT``, first on ``sys.path``; this
    interpreter with the installed ``trikernel`` kernelspec's interpreter flags (start-up
    figures compare like with like). The kernelspec lands in ``root/kernels/trikernel-SHORT``:
    put ``root`` first on ``JUPYTER_PATH``.
    """
    short = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", rev], capture_output=True, text=True, check=True
    ).stdout.strip()
    src = root / f"src-{short}"
    src.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", rev, "trikernel"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    name = f"trikernel-{short}"
    d = root / "kernels" / name
    d.mkdir(parents=True)
    boot = (
        f"import sys, runpy; sys.path.insert(0, {str(src)!r}); "
        "runpy.run_module('trikernel', run_name='__main__', alter_sys=True)"
    )
    spec = {
        "argv": [sys.executable, *_trikernel_python_flags(), "-c", boot, "-f", "{connection_file}"],
        "display_name": name,
        "language": "python",
        "metadata": {"supported_encryption": ["curve"]},
    }
    (d / "kernel.json").write_text(json.dumps(spec))
    return name


def baseline_kernelspecs(revs: Sequence[str], root: pathlib.Path) -> list[str]:
    """:func:`baseline_kernelspec` for each of ``revs``, and ``root`` put first on
    ``JUPYTER_PATH`` (of this process and of those it starts) so that KernelManager finds
    them; returns their names, in the order given."""
    names = [baseline_kernelspec(rev, root) for rev in revs]
    if names:
        os.environ["JUPYTER_PATH"] = str(root) + os.pathsep + os.environ.get("JUPYTER_PATH", "")
    return names


def with_baselines(kernels: Sequence[str], bases: Sequence[str]) -> list[str]:
    """``kernels`` with ``bases`` placed right after the first (trikernel), as latency.py shows them."""
    return [*kernels[:1], *bases, *kernels[1:]]
