"""``ipykernel._version``: the ipykernel API level the facade provides (7.0:
ipykernel 7's shell API; ipywidgets wants at least 6.18 to use ``comm``), and
the protocol version trikernel speaks.

Runs on: any thread (constants).
"""

from __future__ import annotations

__version__ = "7.0.0"
version_info = (7, 0, 0)
kernel_protocol_version_info = (5, 5)
kernel_protocol_version = "5.5"
