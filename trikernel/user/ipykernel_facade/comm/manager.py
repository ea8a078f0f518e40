"""``ipykernel.comm.manager``: the ``comm`` package's ``CommManager`` (the
kernel's one manager is ``get_ipython().kernel.comm_manager``).

Runs on: the main thread at import.
"""

from __future__ import annotations

from comm.base_comm import CommManager

__all__ = ["CommManager"]
