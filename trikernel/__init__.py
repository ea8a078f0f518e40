"""trikernel: a Jupyter kernel for Python on trio structured concurrency.

Public API: ``nursery`` (the user nursery that outlives cells, available once
the kernel runs), ``__version__``.

Runs on: any thread (no code runs here; ``nursery`` is set once, on the
main thread, by the user side's set-up, and read from any thread).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "nursery"]

#: The user nursery (set by the kernel at start-up; None outside a kernel).
nursery: Any = None
