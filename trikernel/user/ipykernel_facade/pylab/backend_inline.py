"""``ipykernel.pylab.backend_inline``: matplotlib-inline's backend, as in
ipykernel (which re-exports it there, deprecated).

Runs on: the main thread at import.
"""

from __future__ import annotations

from matplotlib_inline.backend_inline import *  # noqa: F403
