"""The in-process ``ipykernel`` facade: what libraries import from ipykernel,
answered by trikernel.

Libraries detect a notebook kernel by importing ipykernel or looking for its
modules: tqdm.auto (``'ipykernel.zmqshell' in sys.modules``), bokeh's
``push_notebook``, pyviz_comms, jupyter_dash and matplotlib's nbagg
(``from ipykernel.comm import Comm``), ipywidgets (``ipykernel.version_info``),
loguru (``ipykernel.iostream.OutStream``), wandb and notebook-path recipes
(``ipykernel.connect.get_connection_file()``), ``from ipykernel.kernelapp
import IPKernelApp; IPKernelApp.initialized()``. A real ipykernel beside
trikernel would answer wrongly, and importing it has a side effect that
breaks widgets (``ipykernel.ipkernel`` replaces ``comm.create_comm`` with
one whose comms are silent without ipykernel's own kernel).

So ``set_up`` (user/facade.py) registers this package as
``sys.modules["ipykernel"]`` inside the kernel process only, always,
shadowing a real ipykernel (nothing of which then starts: no second kernel,
no thread, no ``comm.create_comm`` replacement). Its ``__path__`` is this
folder, then the real package's folder if one is installed: submodules
defined here win (``zmqshell``, ``comm``, ``iostream``, ``connect``,
``kernelapp``, ``kernelbase``, ``ipkernel``, ``embed``, ``pylab``,
``_version``); the others (``jsonutil``, ``compiler``, ...) load from the
real package's files. It is never installed as a top-level package.

``__version__`` is the API level emulated (ipykernel 7's shell API), not
the installed wheel's.

Runs on: the main thread at import (``set_up``, user code's imports); its
functions on any thread.
"""

from __future__ import annotations

# comm, iostream, zmqshell: loaded in a running ipykernel too (tqdm looks for
# ipykernel.zmqshell in sys.modules, loguru reads ipykernel.iostream.OutStream
# without importing it)
from . import comm, iostream, zmqshell
from ._version import __version__, kernel_protocol_version, kernel_protocol_version_info, version_info
from .connect import connect_qtconsole, get_connection_file, get_connection_info, write_connection_file

__all__ = [
    "__version__",
    "comm",
    "connect_qtconsole",
    "get_connection_file",
    "get_connection_info",
    "iostream",
    "kernel_protocol_version",
    "kernel_protocol_version_info",
    "version_info",
    "write_connection_file",
    "zmqshell",
]
