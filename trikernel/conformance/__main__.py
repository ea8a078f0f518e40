"""``python -m trikernel.conformance`` is ``trikernel-conformance``.

Runs on: the main thread of the client's process (``python -m
trikernel.conformance``, the ``trikernel-conformance`` command).
"""

from __future__ import annotations

import sys

from trikernel.conformance.cli import main

sys.exit(main())
