"""``ipykernel.kernelapp``: ``IPKernelApp`` is trikernel's (user/kernelapp.py),
already initialized in a running kernel (``IPKernelApp.initialized()``, the
common "am I in a notebook" idiom). Launching another kernel from inside
this one is refused.

Runs on: the main thread at import; ``launch_new_instance`` any thread.
"""

from __future__ import annotations

from typing import Any, NoReturn

from trikernel.user.kernelapp import IPKernelApp

__all__ = ["IPKernelApp", "launch_new_instance", "main"]


def launch_new_instance(*args: Any, **kwargs: Any) -> NoReturn:
    """ipykernel's kernel launcher: refused, this process already is a kernel
    (``IPKernelApp.launch_instance``).

    Raises:
        RuntimeError: always.
    """
    IPKernelApp.launch_instance(*args, **kwargs)
    raise AssertionError("unreachable")


main = launch_new_instance
