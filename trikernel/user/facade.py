"""Registers the ipykernel facade (user/ipykernel_facade) as ``ipykernel``
in this process.

Why (the facade's docstring has the list): libraries find out whether they
run in a notebook through ipykernel's modules and classes, and the real
ipykernel, if installed, answers wrongly inside trikernel — importing
``ipykernel.ipkernel`` even replaces ``comm.create_comm``, after which new
widgets are silent. So the facade is always installed, and shadows a real
ipykernel inside the kernel process only: :func:`install` drops any
``ipykernel*`` module already imported, loads the facade's ``__init__`` as
the module ``ipykernel`` with a ``__path__`` of the facade's folder then
the real package's, and puts it into ``sys.modules``; the facade's own
modules are only ever imported under their ``ipykernel.*`` names. Nothing
is written to disk or to ``PYTHONPATH`` (child processes see the real
ipykernel).

Runs on: the main thread, in the user run (``set_up``), before any user code.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

#: The facade package's folder.
FACADE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ipykernel_facade")


def real_ipykernel_dir() -> str | None:
    """The installed ipykernel's package folder, found without importing it;
    None when it is not installed. Main thread (looks at ``sys.path``)."""
    saved = {name: mod for name, mod in sys.modules.items() if name == "ipykernel" or name.startswith("ipykernel.")}
    for name in saved:
        del sys.modules[name]
    try:
        spec = importlib.util.find_spec("ipykernel")
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.modules.update(saved)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    real = [p for p in locations if os.path.realpath(p) != os.path.realpath(FACADE_DIR)]
    return real[0] if real else None


def install() -> ModuleType:
    """Make ``import ipykernel`` (and its submodules) give the facade in this
    process (module docstring); returns the ``ipykernel`` module. Imports the
    facade's ``comm``, ``iostream`` and ``zmqshell`` at once, as a running
    ipykernel has them loaded. Main thread, before user code; call once."""
    real = real_ipykernel_dir()
    for name in [m for m in sys.modules if m == "ipykernel" or m.startswith("ipykernel.")]:
        del sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        "ipykernel",
        os.path.join(FACADE_DIR, "__init__.py"),
        submodule_search_locations=[FACADE_DIR, *([real] if real else [])],
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ipykernel"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["ipykernel"]
        raise
    return module
