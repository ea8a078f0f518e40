"""``ipykernel.comm.comm``: ``Comm(target_name, data, metadata, buffers, ...)``
as ipykernel's constructor takes it (bokeh's ``push_notebook``, pyviz_comms,
jupyter_dash, matplotlib's nbagg), publishing through trikernel's IOPub
queue like every comm (user/comms.py ``TrikernelComm``).

Runs on: the comm's lane's user run (created and used there; ``send`` from
any thread but the io thread).
"""

from __future__ import annotations

from typing import Any

from trikernel.user.comms import TrikernelComm, new_comm_id

__all__ = ["BaseComm", "Comm"]


class Comm(TrikernelComm):
    """ipykernel's ``Comm``: opened on creation (``primary``, as ipykernel's),
    registered with the kernel's comm manager. ``kernel`` is accepted and
    ignored; the ``kernel`` attribute is ``get_ipython().kernel``."""

    def __init__(
        self,
        target_name: str = "",
        data: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        buffers: list[bytes] | None = None,
        show_warning: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("kernel", None)
        del show_warning  # ipykernel's deprecation warning for creating Comms directly
        if target_name:
            kwargs["target_name"] = target_name
        kwargs["comm_id"] = kwargs.get("comm_id") or new_comm_id()
        super().__init__(data=data, metadata=metadata, buffers=buffers, **kwargs)

    @property
    def kernel(self) -> Any:
        """The running kernel's handle, ``get_ipython().kernel`` (None outside a kernel)."""
        from IPython import get_ipython

        shell = get_ipython()
        return getattr(shell, "kernel", None) if shell is not None else None


BaseComm = Comm
