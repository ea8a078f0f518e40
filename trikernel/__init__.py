"""trikernel: a Jupyter kernel for Python on trio structured concurrency.

Public API: ``nursery`` (the user nursery that outlives cells, available once
the kernel runs), ``__version__``.

Runs on: any thread (no code runs here; ``nursery`` is set once, on the
main thread, by the user side's set-up, and read from any thread).
"""

from __future__ import annotations

import os
from typing import Any

__version__ = "0.1.0"
__all__ = ["PARENT_AT_START", "__version__", "nursery"]

#: ``os.getppid()`` as the package was first imported: ``python -m trikernel``
#: reads it within milliseconds of being launched, before the seconds that
#: loading the kernel takes on a busy machine, in which its launcher may
#: die (server/iorun.py, ``JPY_PARENT_PID``).
PARENT_AT_START = os.getppid()

#: The user nursery (set by the kernel at start-up; None outside a kernel).
nursery: Any = None
