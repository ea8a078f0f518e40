"""``ipykernel.comm``: ``Comm`` with ipykernel's constructor over trikernel's
comms, and ``CommManager`` (the ``comm`` package's).

Runs on: the main thread at import.
"""

from __future__ import annotations

from .comm import BaseComm, Comm
from .manager import CommManager

__all__ = ["BaseComm", "Comm", "CommManager"]
