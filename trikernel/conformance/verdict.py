"""Verdicts: what one check returns, and the exceptions that end a check early.

A check returns a :class:`Verdict` (``passed``/``failed``/``skipped``) or
raises :class:`Fail` (a departure found deep in a helper, e.g. a deadline
that passed) or :class:`Skip`. The ``figure`` is the measured fact that
decided it ("0 of 20 queued cells ran", "no idle within 10 s").

Pure; any thread.

Runs on: any thread (pure: a frozen dataclass, four constructors and
two exceptions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["PASS", "FAIL", "SKIP"]


class Fail(Exception):
    """The kernel departed from the spec; ``str(exc)`` is the figure."""


class Skip(Exception):
    """The check does not apply to this kernel; ``str(exc)`` says why."""


@dataclass(frozen=True)
class Verdict:
    """What one check decided: ``status`` "PASS", "FAIL" or "SKIP", and ``figure``, the measured
    fact that decided it (for SKIP: why the check does not apply)."""

    status: Status
    figure: str


def passed(figure: str) -> Verdict:
    """A PASS :class:`Verdict` with ``figure``."""
    return Verdict("PASS", figure)


def failed(figure: str) -> Verdict:
    """A FAIL :class:`Verdict` with ``figure``, the departure that was found."""
    return Verdict("FAIL", figure)


def skipped(why: str) -> Verdict:
    """A SKIP :class:`Verdict`; ``why`` says why the check does not apply to this kernel."""
    return Verdict("SKIP", why)


def verdict(ok: bool, figure: str) -> Verdict:
    """PASS if ``ok`` else FAIL, with the same figure."""
    return Verdict("PASS" if ok else "FAIL", figure)
