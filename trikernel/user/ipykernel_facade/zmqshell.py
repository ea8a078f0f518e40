"""``ipykernel.zmqshell``: the class of ``get_ipython()`` in trikernel
(user/zmqshell.py), whose ``__module__`` names this module.

Runs on: the main thread at import.
"""

from __future__ import annotations

from trikernel.user.zmqshell import ZMQInteractiveShell

__all__ = ["ZMQInteractiveShell"]
