"""``ipykernel.ipkernel``: ``IPythonKernel`` is the running kernel's handle
class, as ``kernelbase.Kernel``. Unlike ipykernel's module, importing this one
does not replace ``comm.create_comm`` (which left every later widget
silent in a kernel that is not ipykernel's).

Runs on: any thread.
"""

from __future__ import annotations

from trikernel.user.kernelhandle import KernelHandle

from .kernelbase import Kernel

__all__ = ["IPythonKernel"]


class IPythonKernel(Kernel):
    """ipykernel's IPython kernel class, as user code sees it (see ``Kernel``)."""


IPythonKernel.register(KernelHandle)
