"""kernel.json for trikernel and its installation (jupyter_client docs/kernels.rst, "Kernel specs").

The spec declares ``interrupt_mode`` "signal" (SIGINT from the launcher; the
kernel also honours interrupt_request on control), ``kernel_protocol_version``
"5.6" (JEP 66 handshake support), ``metadata.supported_encryption: ["curve"]``
(jupyter_client 8.10 transport encryption) and, with ``--handshake``,
``metadata.kernel_provisioner`` selecting the ``trikernel-handshake``
provisioner.

``metadata.debugger`` is true when debugpy is installed for the
interpreter writing the spec (the kernel's: ``sys.executable``), which is
what turns JupyterLab's bug icon on (debugger.py). On CPython the argv
carries ``-Xfrozen_modules=off``: with frozen standard-library modules
(3.11+) debugpy warns and can miss breakpoints.

Runs on: the main thread of ``python -m trikernel install``, at install
time (no kernel runs; no trio).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

KERNEL_NAME = "trikernel"
DISPLAY_NAME = "Python 3 (trikernel)"
#: The kernelspec name ipykernel's wheel installs (share/jupyter/kernels/python3).
IPYKERNEL_NAME = "python3"
RESOURCES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "resources")
#: Interpreter options of the kernel's argv: CPython 3.11+ freezes standard
#: modules, which debugpy cannot set breakpoints in or map back to files.
PYTHON_FLAGS: tuple[str, ...] = ("-Xfrozen_modules=off",) if sys.implementation.name == "cpython" else ()


def default_display_name(name: str) -> str:
    """The display name of a spec installed as ``name`` without ``--display-name``:
    :data:`DISPLAY_NAME` for the ``trikernel`` spec (which ``pip install`` ships
    too); under any other name one that tells the two apart in JupyterLab's
    launcher, ``Python 3 (trikernel, as NAME)`` (``--name python3`` made two
    identical "Python 3 (trikernel)" cards)."""
    return DISPLAY_NAME if name == KERNEL_NAME else f"Python 3 (trikernel, as {name})"


def kernel_json(
    *,
    python: str = "python",
    display_name: str = DISPLAY_NAME,
    extra_argv: Sequence[str] = (),
    interrupt_mode: str = "signal",
    handshake: bool = False,
) -> dict[str, Any]:
    """The kernelspec dict. ``python``: interpreter path or "python"
    (assumed to be this interpreter's kind: ``-Xfrozen_modules=off`` for
    CPython, ``metadata.debugger`` from :func:`trikernel.debugger.available`)."""
    from trikernel.debug.debugger import available

    spec: dict[str, Any] = {
        "argv": [python, *PYTHON_FLAGS, "-m", "trikernel", "-f", "{connection_file}", *extra_argv],
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": interrupt_mode,
        "kernel_protocol_version": "5.6",
        "metadata": {"debugger": available(), "supported_encryption": ["curve"]},
    }
    if handshake:
        spec["metadata"]["kernel_provisioner"] = {"provisioner_name": "trikernel-handshake", "config": {}}
    return spec


def install(
    *,
    user: bool = False,
    prefix: str | None = None,
    name: str = KERNEL_NAME,
    display_name: str | None = None,
    extra_argv: Sequence[str] = (),
    interrupt_mode: str = "signal",
    handshake: bool = False,
) -> str:
    """Write the kernelspec through jupyter_client's KernelSpecManager; returns its directory.

    ``display_name`` None: :func:`default_display_name`. A spec of the same
    ``name`` in that place is replaced: ``--name python3`` overwrites
    ipykernel's (docs/compatibility.md)."""
    if display_name is None:
        display_name = default_display_name(name)
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory() as td:
        path = os.path.join(td, name)
        os.makedirs(path)
        spec = kernel_json(
            python=sys.executable,
            display_name=display_name,
            extra_argv=extra_argv,
            interrupt_mode=interrupt_mode,
            handshake=handshake,
        )
        with open(os.path.join(path, "kernel.json"), "w") as f:
            json.dump(spec, f, indent=1)
        for logo in ("logo-32x32.png", "logo-64x64.png", "logo-svg.svg"):
            src = os.path.join(RESOURCES, logo)
            if os.path.exists(src):
                shutil.copy(src, path)
        return str(KernelSpecManager().install_kernel_spec(path, name, user=user, prefix=prefix))
