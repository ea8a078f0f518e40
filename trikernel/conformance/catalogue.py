"""The catalogue: every check, its spec section, and the context it runs in.

A check is a function ``(ctx) -> Verdict`` registered with :func:`check`
under a dotted name (``execute.error``), the spec section it follows and a
one-line summary of what passes. Checks run in registration order, grouped
by phase:

- ``shared``: on the one kernel the run starts, in order; a check that
  fails is followed by a recovery (interrupt, then restart) so the next
  check gets an answering kernel;
- ``audit``: the every-message checks, after the shared checks, reporting
  on all the traffic of the run;
- ``final``: restart and shutdown, which end the shared kernel;
- ``fresh``: checks that start kernels of their own (start-up handshakes).

Caller's thread only.

Runs on: the client side, the suite's thread only (checks register at
import; the runner runs them one at a time).
"""

from __future__ import annotations

import fnmatch
import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from trikernel.conformance.snippets import Python, for_language
from trikernel.conformance.verdict import Skip, Verdict

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from trikernel.conformance.client import Channels
    from trikernel.conformance.kernel import Deadlines, KernelUnderTest

Phase = Literal["shared", "audit", "final", "fresh"]
PHASES: tuple[Phase, ...] = ("shared", "audit", "final", "fresh")


class Ctx:
    """What a check sees: the kernel, its channels, deadlines and code snippets."""

    def __init__(self, kernel: KernelUnderTest, deadlines: Deadlines):
        self.k = kernel
        self.t = deadlines
        #: Values checks leave for later checks (e.g. the first session id).
        self.notes: dict[str, Any] = {}

    @property
    def ch(self) -> Channels:
        """The suite's :class:`~.client.Channels` to the current kernel process (a new object
        after each restart). Raises :class:`~.verdict.Fail` when the kernel did not start."""
        return self.k.ch

    @property
    def language(self) -> str:
        """The kernel's ``language_info.name`` from its ``kernel_info_reply`` (messaging spec
        "Kernel info"); ``""`` when it gave none or ``language_info`` is not an object."""
        li = self.k.info.get("language_info") or {}
        return str(li.get("name", "")) if isinstance(li, dict) else ""

    @property
    def code(self) -> type[Python]:
        """The snippet profile of the kernel's language; Skip if there is none."""
        prof = for_language(self.language)
        if prof is None:
            raise Skip(f"no code snippets for language {self.language!r}")
        return prof

    @property
    def has_code(self) -> bool:
        """Whether :mod:`.snippets` has a code profile for the kernel's language, i.e. whether
        checks that run code can run (:attr:`code` would not raise Skip)."""
        return for_language(self.language) is not None


@dataclass(frozen=True)
class Check:
    """One row of the report."""

    name: str
    section: str
    summary: str
    fn: Callable[[Ctx], Verdict] = field(repr=False)
    phase: Phase = "shared"


_REGISTRY: dict[str, Check] = {}
#: Modules of checks, in run order within a phase.
CHECK_MODULES = (
    "checks_lifecycle",
    "checks_execute",
    "checks_requests",
    "checks_stdin",
    "checks_iopub",
    "checks_robustness",
    "checks_interrupt",
    "checks_envelope",
)


def check(
    name: str, section: str, summary: str | None = None, *, phase: Phase = "shared"
) -> Callable[[Callable[[Ctx], Verdict]], Callable[[Ctx], Verdict]]:
    """Register a check function under ``name`` (unique), for the spec
    ``section``. ``summary``, the claim the report's row makes, is the
    function's docstring unless given (its lines joined by single spaces).
    ValueError for a name used twice or a check with no summary."""

    def register(fn: Callable[[Ctx], Verdict]) -> Callable[[Ctx], Verdict]:
        if name in _REGISTRY:
            raise ValueError(f"duplicate check name {name!r}")
        claim = summary if summary is not None else " ".join((fn.__doc__ or "").split())
        if not claim:
            raise ValueError(f"check {name!r} has no summary")
        _REGISTRY[name] = Check(name, section, claim, fn, phase)
        return fn

    return register


def catalogue() -> list[Check]:
    """Every check, in run order (phases in order, registration order within)."""
    for module in CHECK_MODULES:  # importing registers the checks, in this order
        importlib.import_module(f"{__package__}.{module}")
    checks = list(_REGISTRY.values())
    return sorted(checks, key=lambda c: PHASES.index(c.phase))


def select(patterns: Iterable[str] | None) -> list[Check]:
    """Checks matching any pattern: an exact name, a glob (``iopub.*``) or a
    group prefix (``iopub`` selects ``iopub.*``). ValueError names a pattern
    that matches nothing."""
    every = catalogue()
    pats = list(patterns or [])
    if not pats:
        return every
    chosen: list[Check] = []
    for pat in pats:
        hits = [c for c in every if c.name == pat or fnmatch.fnmatchcase(c.name, pat) or c.name.startswith(pat + ".")]
        if not hits:
            raise ValueError(f"--check {pat!r} matches no check (see --list)")
        chosen.extend(c for c in hits if c not in chosen)
    return [c for c in every if c in chosen]
