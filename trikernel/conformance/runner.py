"""Run a selection of the catalogue against one kernelspec and collect the rows.

:func:`run` starts the kernel once for the shared, audit and final phases
(restarting it only when a check leaves it dead or stuck), then runs the
fresh-phase checks, which start kernels of their own. Each check yields one
:class:`Row`; a check that raises anything is a FAIL with the exception as
its figure, never a crash of the run. Every wait inside has a deadline, so
a hanging kernel costs at most the deadlines of the checks it hangs.

Caller's thread only.

Runs on: the client side, the suite's thread only (one check at a time;
every wait has a deadline).
"""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from jupyter_client.kernelspec import NoSuchKernel

from trikernel.conformance.audit import Audit
from trikernel.conformance.catalogue import Check, Ctx, select
from trikernel.conformance.kernel import Deadlines, KernelUnderTest
from trikernel.conformance.verdict import Fail, Skip, Status, Verdict, failed, skipped

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

log = logging.getLogger("trikernel.conformance")


class UsageError(Exception):
    """A bad argument (no such kernelspec, a --check that matches nothing)."""


@dataclass(frozen=True)
class Row:
    """One check's result: ``seconds`` is its wall time."""

    name: str
    status: Status
    figure: str
    section: str
    seconds: float


@dataclass
class Report:
    """The rows of one run, with what identifies the kernel."""

    kernel: str
    display_name: str
    implementation: str
    protocol_version: str
    interrupt_mode: str
    handshake: bool
    rows: list[Row] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        """Whether any row is a FAIL (the command then exits with status 1)."""
        return any(r.status == "FAIL" for r in self.rows)

    def counts(self) -> dict[str, int]:
        """The number of rows per status: ``{"PASS": n, "FAIL": n, "SKIP": n}``."""
        out = {"PASS": 0, "FAIL": 0, "SKIP": 0}
        for r in self.rows:
            out[r.status] += 1
        return out

    def as_json(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (``--json``): the kernel's fields, ``rows`` as dicts,
        ``seconds`` (wall time of the run) and ``counts``."""
        d = asdict(self)
        d["counts"] = self.counts()
        return d


def _run_one(ctx: Ctx, check: Check) -> Verdict:
    try:
        return check.fn(ctx)
    except Fail as exc:
        return failed(str(exc))
    except Skip as exc:
        return skipped(str(exc))
    except Exception as exc:  # a kernel that answers nonsense can break a check's reading of it
        log.debug("check %s raised:\n%s", check.name, traceback.format_exc())
        return failed(f"unexpected {type(exc).__name__}: {exc!s:.200}")


def _decide(ctx: Ctx, check: Check) -> tuple[Verdict, str]:
    """Run one check on a live kernel: (verdict, note on what the runner did)."""
    kernel = ctx.k
    if check.phase == "fresh":
        return _run_one(ctx, check), ""
    if "dead" in ctx.notes:
        return failed(ctx.notes["dead"]), ""
    note = ""
    if check.phase in ("shared", "audit") and not kernel.alive():
        try:
            kernel.restart()
        except Fail as exc:
            ctx.notes["dead"] = f"the kernel died and did not restart: {exc}"
            return failed(ctx.notes["dead"]), ""
        note = " [the kernel had died; restarted before this check]"
    v = _run_one(ctx, check)
    if v.status == "FAIL" and check.phase in ("shared", "audit"):
        try:
            done = kernel.recover(ctx.code.noop if ctx.has_code else None)
        except Fail as exc:
            ctx.notes["dead"] = f"the kernel is stuck and did not restart: {exc}"
            done = ctx.notes["dead"]
        if done:
            note += f" [{done}]"
    return v, note


def run(
    kernel_name: str,
    patterns: Iterable[str] | None = None,
    *,
    timeout_scale: float = 1.0,
    on_row: Callable[[Row], None] | None = None,
    on_start: Callable[[Report], None] | None = None,
) -> Report:
    """Run the selected checks against ``kernel_name``; returns the Report.

    ``patterns``: names, globs or group prefixes (see catalogue.select);
    None runs everything. ``on_row`` is called with each Row as it is
    decided; ``on_start`` once the kernel answered (or failed to start).
    Raises UsageError for an unknown kernelspec or a pattern that matches
    nothing.
    """
    try:
        chosen = select(patterns)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    t = Deadlines.scaled(timeout_scale)
    audit = Audit()
    try:
        kernel = KernelUnderTest(kernel_name, audit, t)
    except NoSuchKernel:
        raise UsageError(f"no kernelspec named {kernel_name!r} (see: jupyter kernelspec list)") from None
    ctx = Ctx(kernel, t)
    report = Report(
        kernel_name,
        kernel.spec.display_name,
        "",
        "",
        kernel.interrupt_mode,
        kernel.handshake,
    )
    t_run = time.monotonic()
    start_error: str | None = None
    try:
        if any(c.phase != "fresh" for c in chosen):
            try:
                kernel.start()
            except Fail as exc:
                start_error = str(exc)
        report.implementation = (
            f"{kernel.info.get('implementation', '?')} {kernel.info.get('implementation_version', '')}".strip()
        )
        report.protocol_version = str(kernel.info.get("protocol_version", ""))
        if on_start is not None:
            on_start(report)
        if start_error is not None:
            ctx.notes["dead"] = f"the kernel did not start: {start_error}"
        stopped = False
        for check in chosen:
            t0 = time.monotonic()
            if check.phase == "fresh" and not stopped:
                kernel.stop()
                stopped = True
            v, note = _decide(ctx, check)
            row = Row(check.name, v.status, v.figure + note, check.section, time.monotonic() - t0)
            report.rows.append(row)
            if on_row is not None:
                on_row(row)
    finally:
        kernel.close()
    report.seconds = time.monotonic() - t_run
    return report
