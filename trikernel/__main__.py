"""``python -m trikernel``: run a kernel or install the kernelspec.

``python -m`` puts the working directory first on ``sys.path``: a notebook
folder holding ``trio.py``, ``comm.py`` or ``zmq.py`` would then shadow
what the kernel imports and kill it at start-up. The entry is set aside
before anything is imported and given back to user code once IPython has
loaded (``user.interpreter.set_up``), as ipykernel's launcher does, so ``import
mymodule`` from the notebook's folder still works.

Runs on: the main thread, before any other thread exists (it sets the
working directory aside, then runs launch/cli.py's ``main``).
"""

from __future__ import annotations

import os
import sys

import trikernel

if sys.path and sys.path[0] in ("", os.getcwd()):
    trikernel._user_path_entry = sys.path.pop(0)

from trikernel.launch.cli import main  # after the working directory left sys.path

if __name__ == "__main__":
    sys.exit(main())
