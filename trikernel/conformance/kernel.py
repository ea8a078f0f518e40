"""The kernel under test: started, restarted, interrupted and stopped with jupyter_client.

:class:`KernelUnderTest` owns one ``jupyter_client.KernelManager`` for a
kernelspec and the suite's :class:`~.client.Channels` to the current kernel
process. A kernelspec that declares the JEP 66 handshake
(:func:`trikernel.provisioner.wants_handshake`) and names no provisioner of
its own is started through trikernel's ``trikernel-handshake`` provisioner;
every other kernelspec starts exactly as jupyter_client starts it.
Interrupts follow the kernelspec's ``interrupt_mode`` (kernels.rst "Kernel
specs"): ``signal`` through ``KernelManager.interrupt_kernel``, ``message``
as an ``interrupt_request`` on the suite's own control socket, so the
``interrupt_reply`` is seen and audited.

The kernel's stdout and stderr go to a log file (its tail is the figure
when a start fails). Every wait has a deadline (:class:`Deadlines`).

Caller's thread only.

Runs on: the client side, the suite's thread only (a synchronous
jupyter_client ``KernelManager`` and the suite's own pyzmq context).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import KernelManager

from trikernel.conformance.client import Channels, Timeout
from trikernel.conformance.verdict import Fail
from trikernel.launch.provisioner import wants_handshake

if TYPE_CHECKING:
    from collections.abc import Iterator

    from trikernel.conformance.audit import Audit
    from trikernel.conformance.received import Received

log = logging.getLogger("trikernel.conformance")

HANDSHAKE_PROVISIONER = "trikernel-handshake"


@dataclass(frozen=True)
class Deadlines:
    """Seconds the suite waits for each kind of event (all scaled by ``scale``)."""

    start: float = 60.0
    reply: float = 10.0
    interrupt: float = 5.0
    flood: float = 60.0
    exit: float = 10.0
    welcome: float = 5.0
    quiet: float = 0.5

    @classmethod
    def scaled(cls, scale: float) -> Deadlines:
        """A :class:`Deadlines` with every field multiplied by ``scale`` (``--timeout-scale``; a
        positive float, e.g. 3 on a slow machine)."""
        base = cls()
        return cls(**{k: getattr(base, k) * scale for k in base.__dataclass_fields__})


class HandshakeSpecs(KernelSpecManager):
    """KernelSpecManager that routes JEP 66 kernelspecs to trikernel-handshake.

    Only kernelspecs that declare the handshake and name no provisioner are
    changed (their metadata gains ``kernel_provisioner``); the spec files on
    disk are never touched.
    """

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        """``KernelSpecManager.get_kernel_spec``, except that a spec which declares the JEP 66
        handshake and names no provisioner gets ``metadata.kernel_provisioner`` =
        ``trikernel-handshake`` in memory. Raises jupyter_client's NoSuchKernel for an unknown
        name."""
        spec = super().get_kernel_spec(kernel_name)
        md = dict(spec.metadata or {})
        if declares_handshake(spec) and "kernel_provisioner" not in md:
            md["kernel_provisioner"] = {"provisioner_name": HANDSHAKE_PROVISIONER, "config": {}}
            spec.metadata = md
        return spec


def declares_handshake(spec: KernelSpec) -> bool:
    """Whether the kernelspec declares JEP 66 (docs/handshake.md, "Which kernelspecs get the handshake")."""
    md = spec.metadata or {}
    prov = md.get("kernel_provisioner") or {}
    override = (
        (prov.get("config") or {}).get("handshake") if prov.get("provisioner_name") == HANDSHAKE_PROVISIONER else None
    )
    return wants_handshake(spec.kernel_protocol_version, md, override=override)


class _DialectLog(logging.Handler):
    """Picks the dialect out of the provisioner's 'registered (dialect X)' log line."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.dialect: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if "registered (dialect" in str(record.msg) and len(record.args or ()) >= 2:
            self.dialect = str(record.args[1])  # type: ignore[index]


@contextlib.contextmanager
def _watch_dialect() -> Iterator[_DialectLog]:
    logger = logging.getLogger("trikernel.provisioner")
    handler = _DialectLog()
    old = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


class KernelUnderTest:
    """One kernelspec's kernel, as the checks see it (see the module docstring)."""

    def __init__(self, name: str, audit: Audit, deadlines: Deadlines, *, log_dir: str | None = None):
        self.name = name
        self.audit = audit
        self.t = deadlines
        self.specs = HandshakeSpecs()
        self.spec: KernelSpec = self.specs.get_kernel_spec(name)
        self.handshake = declares_handshake(self.spec)
        self.interrupt_mode = str(getattr(self.spec, "interrupt_mode", "signal") or "signal")
        self.context: zmq.Context[Any] = zmq.Context()
        self.km: KernelManager | None = None
        self._ch: Channels | None = None
        self.info: dict[str, Any] = {}
        self.dialect: str | None = None
        self.started_in = 0.0
        self.ready_in = 0.0
        self.connected_at = 0.0
        self.starts = 0
        fd, self.log_path = tempfile.mkstemp(prefix=f"conformance-{name}-", suffix=".log", dir=log_dir)
        os.close(fd)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the kernel

    # -- lifecycle -------------------------------------------------------------
    @property
    def ch(self) -> Channels:
        """The :class:`~.client.Channels` to the current kernel process (replaced at every start
        and restart). Raises :class:`~.verdict.Fail` when no kernel is running (it did not
        start)."""
        if self._ch is None:
            raise Fail("no kernel: it did not start")
        return self._ch

    def log_tail(self, limit: int = 600) -> str:
        """The last ``limit`` characters (default 600) of the kernel's stdout/stderr log, its
        non-blank lines joined with " | " (a figure for a failed start); ``""`` if the log
        cannot be read."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - limit))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text.splitlines() if line.strip())[-limit:]

    def start(self) -> None:
        """Start the kernel and wait until it answers kernel_info; Fail if it does not."""
        self.km = KernelManager(kernel_name=self.name, kernel_spec_manager=self.specs)
        t0 = time.monotonic()
        with _watch_dialect() as seen:
            try:
                self.km.start_kernel(stdout=self._log, stderr=self._log)
            except Exception as exc:
                raise Fail(f"the kernel did not start: {exc!s:.300} (log: {self.log_tail()})") from None
        self.dialect = seen.dialect
        self.started_in = time.monotonic() - t0
        self.starts += 1
        self._connect()

    def _connect(self) -> None:
        assert self.km is not None
        self._ch = Channels(self.km.get_connection_info(), self.audit, self.context)
        self.connected_at = time.monotonic()
        try:
            self._ch.wait_connected(self.t.start, self.alive)
        except Fail as exc:
            if not self.alive():
                raise Fail(
                    f"the kernel exited during start-up with code {self.exit_code()} (log: {self.log_tail()})"
                ) from None
            raise Fail(f"{exc} (log: {self.log_tail()})") from None
        self.info = self._wait_ready()
        self.ready_in = time.monotonic() - self.connected_at

    def _wait_ready(self) -> dict[str, Any]:
        """kernel_info on shell until a reply and an IOPub message arrive (as
        jupyter_client's wait_for_ready), within ``Deadlines.start``."""
        ch = self.ch
        deadline = time.monotonic() + self.t.start
        reply: Received | None = None
        while time.monotonic() < deadline:
            if not self.alive():
                raise Fail(f"the kernel exited during start-up with code {self.exit_code()} (log: {self.log_tail()})")
            h = ch.send("shell", "kernel_info_request", {})
            try:
                reply = ch.reply(h, min(1.0, max(0.05, deadline - time.monotonic())), channel="shell")
                mid = h["msg_id"]
                ch.wait(lambda: ch.for_parent(mid, socket="iopub") or None, 1.0, "iopub")  # noqa: B023 - called at once
            except Timeout:
                continue
            return dict(reply.content)
        raise Fail(f"no kernel_info_reply with IOPub traffic within {self.t.start:g} s (log: {self.log_tail()})")

    def alive(self) -> bool:
        """Whether a kernel process was started and jupyter_client's ``is_alive`` says it still
        runs."""
        return self.km is not None and self.km.has_kernel and bool(self.km.is_alive())

    def process(self) -> Any:
        """The kernel's process object as the provisioner holds it (a ``subprocess.Popen`` for
        LocalProvisioner and trikernel-handshake), or None when there is none."""
        prov = getattr(self.km, "provisioner", None)
        return getattr(prov, "process", None)

    def pid(self) -> int | None:
        """The kernel process's pid, or None when no process is known."""
        proc = self.process()
        return getattr(proc, "pid", None)

    def exit_code(self) -> int | None:
        """The kernel process's exit code (negative: killed by that signal), or None while it
        runs or when no process is known. Does not wait."""
        proc = self.process()
        return proc.poll() if proc is not None else None

    def wait_exit(self, timeout: float) -> tuple[int | None, float]:
        """(exit code or None if still running, seconds waited)."""
        t0 = time.monotonic()
        proc = self.process()
        while proc is not None and time.monotonic() - t0 < timeout:
            code = proc.poll()
            if code is not None:
                return code, time.monotonic() - t0
            time.sleep(0.02)  # a process exit has no event to wait on here
        return (proc.poll() if proc is not None else None), time.monotonic() - t0

    def restart(self) -> None:
        """Kill whatever runs now and start the kernel again (new Channels)."""
        if self._ch is not None:
            self._ch.close()
            self._ch = None
        if self.km is None or not self.km.has_kernel:
            self.start()
            return
        t0 = time.monotonic()
        with _watch_dialect() as seen:
            try:
                self.km.restart_kernel(now=True, stdout=self._log, stderr=self._log)
            except Exception as exc:
                raise Fail(f"the kernel did not restart: {exc!s:.300} (log: {self.log_tail()})") from None
        self.dialect = seen.dialect or self.dialect
        self.started_in = time.monotonic() - t0
        self.starts += 1
        self._connect()

    def stop(self) -> None:
        """Shut the kernel down (a shutdown_request, then kill) and close the sockets."""
        if self._ch is not None:
            self._ch.close()
            self._ch = None
        if self.km is not None and self.km.has_kernel:
            self.km.shutdown_wait_time = min(5.0, self.t.exit)
            try:
                self.km.shutdown_kernel(now=not self.alive())
            except Exception as exc:
                log.warning("shutting the kernel down: %s", exc)
                with contextlib.suppress(Exception):
                    self.km.shutdown_kernel(now=True)

    def close(self) -> None:
        """End of the suite's use of this kernelspec: :meth:`stop` the kernel, terminate the
        suite's pyzmq context, close and delete the kernel's log file."""
        self.stop()
        self.context.term()
        self._log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log_path)

    # -- actions the checks use ------------------------------------------------
    def interrupt(self) -> dict[str, Any] | None:
        """Interrupt in the kernelspec's mode; the interrupt_request header in mode 'message'."""
        if self.interrupt_mode == "message":
            return self.ch.send("control", "interrupt_request", {})
        assert self.km is not None
        self.km.interrupt_kernel()
        return None

    def fence(self, code: str | None, timeout: float) -> Received:
        """A request that can only be answered after everything sent before it
        on shell: a silent no-op execute (or kernel_info with no code)."""
        ch = self.ch
        if code is None:
            h = ch.send("shell", "kernel_info_request", {})
        else:
            h = ch.execute(code, silent=True, store_history=False)
        return ch.reply(h, timeout, channel="shell")

    def settle(self, code: str | None) -> None:
        """A cell still runs (a check gave up on it): interrupt it and, if
        that does not make the kernel answer within ``Deadlines.interrupt``,
        restart the kernel."""
        try:
            self.interrupt()
            self.fence(code, self.t.interrupt)
        except Fail:
            self.restart()

    def recover(self, code: str | None) -> str | None:
        """After a failed check: make the kernel idle and answering again.

        A no-op execute; if it is not answered, interrupt and try again; if
        still not (or the kernel is dead), restart. Returns what was done, or
        None when the kernel was fine.
        """
        if self._ch is None:
            return None
        if self.alive():
            try:
                self.fence(code, self.t.interrupt)
                return None
            except Fail:
                pass
            try:
                self.interrupt()
                self.fence(code, self.t.interrupt)
                return "interrupted a request still running"
            except Fail:
                pass
            died = "did not answer"
        else:
            died = f"had exited (code {self.exit_code()})"
        self.restart()
        return f"kernel {died}; restarted"
