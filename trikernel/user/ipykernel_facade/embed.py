"""``ipykernel.embed``: embedding a kernel would start a second kernel inside
this one; refused.

Runs on: any thread.
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["embed_kernel"]


def embed_kernel(module: Any = None, local_ns: Any = None, **kwargs: Any) -> NoReturn:
    """ipykernel's ``embed_kernel``: refused inside a running kernel.

    Raises:
        RuntimeError: always.
    """
    raise RuntimeError("trikernel: embed_kernel would start a second kernel inside this one")
