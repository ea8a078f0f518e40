"""``python -m trikernel``: run a kernel or install the kernelspec.

``python -m`` puts the working directory first on ``sys.path``: a notebook
folder holding ``trio.py``, ``comm.py`` or ``zmq.py`` would then shadow
what the kernel imports and kill it at start-up. The entry is removed
before anything is imported, as ipykernel's launcher does; once IPython has
loaded, IPython's ``init_path`` puts ``''`` on ``sys.path`` just before the
first site-packages entry (user/kernelapp.py), so ``import mymodule`` from
the notebook's folder works (and follows ``%cd``), and a notebook's
``statistics.py`` does not shadow the standard library.

Runs on: the main thread, before any other thread exists (it removes the
working directory's entry, then runs launch/cli.py's ``main``).
"""

from __future__ import annotations

import os
import sys

if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from trikernel.launch.cli import main  # after the working directory left sys.path

if __name__ == "__main__":
    sys.exit(main())
