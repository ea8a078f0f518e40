"""``ipykernel.kernelbase``: ``Kernel.instance()`` is ``get_ipython().kernel``
(user/kernelhandle.py), which ``isinstance`` counts as a ``Kernel``.

Runs on: any thread.
"""

from __future__ import annotations

from abc import ABCMeta
from typing import Any

from trikernel.user.kernelhandle import KernelHandle

__all__ = ["Kernel"]


class Kernel(metaclass=ABCMeta):  # noqa: B024  (a virtual base: KernelHandle is registered)
    """ipykernel's kernel base class, as user code sees it: the running
    kernel's handle is an instance (``isinstance``), reached with
    :meth:`instance`. Not meant to be subclassed or created."""

    @classmethod
    def initialized(cls) -> bool:
        """True in a running kernel whose user side is up (ipykernel's
        ``SingletonConfigurable.initialized``)."""
        return _handle() is not None

    @classmethod
    def instance(cls, *args: Any, **kwargs: Any) -> Any:
        """The running kernel's handle, ``get_ipython().kernel``.

        Raises:
            RuntimeError: outside a running kernel.
        """
        handle = _handle()
        if handle is None:
            raise RuntimeError("trikernel: no kernel is running in this process")
        return handle


def _handle() -> Any:
    from IPython import get_ipython

    shell = get_ipython()
    return getattr(shell, "kernel", None) if shell is not None else None


Kernel.register(KernelHandle)
