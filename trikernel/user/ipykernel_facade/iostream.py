"""``ipykernel.iostream``: trikernel's output stream class, so that
``isinstance(sys.stdout, ipykernel.iostream.OutStream)`` holds (loguru
colours its output then). ipykernel's ``IOPubThread`` and
``BackgroundSocket`` are not provided: trikernel has no IOPub thread of
user code's.

Runs on: the main thread at import.
"""

from __future__ import annotations

from trikernel.user.outstream import OutStream

__all__ = ["OutStream"]
