"""``ipykernel.connect``: the connection file and info of this kernel, and
``connect_qtconsole``, as ipykernel's.

Runs on: any thread (reads the app's ``connection_file``, set at start-up).
"""

from __future__ import annotations

import json
import sys
from subprocess import PIPE, Popen
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trikernel.user.kernelapp import IPKernelApp

__all__ = ["connect_qtconsole", "get_connection_file", "get_connection_info", "write_connection_file"]


def write_connection_file(*args: Any, **kwargs: Any) -> tuple[str, Any]:
    """jupyter_client's ``write_connection_file`` (ipykernel re-exports it);
    jupyter_client is imported only when it is called."""
    from jupyter_client.connect import write_connection_file as write

    return write(*args, **kwargs)


def get_connection_file(app: IPKernelApp | None = None) -> str:
    """The path of the kernel's connection file (the file given with ``-f``).

    Raises:
        RuntimeError: outside a running kernel (no app), as ipykernel's.
    """
    if app is None:
        from .kernelapp import IPKernelApp

        if not IPKernelApp.initialized():
            raise RuntimeError("app not specified, and not in a running Kernel")
        app = IPKernelApp.instance()
    return str(app.connection_file)


def _find(connection_file: str | None) -> str:
    if connection_file is None:
        return get_connection_file()
    import jupyter_client

    return str(jupyter_client.find_connection_file(connection_file))


def get_connection_info(connection_file: str | None = None, unpack: bool = False) -> str | dict[str, Any]:
    """The connection info of this kernel (or of ``connection_file``, found as
    jupyter_client finds it): the file's text, or with ``unpack`` its dict
    with ``key`` as bytes. Raises OSError when the file cannot be read."""
    with open(_find(connection_file)) as f:
        text = f.read()
    if not unpack:
        return text
    info: dict[str, Any] = json.loads(text)
    info["key"] = info.get("key", "").encode()
    return info


def connect_qtconsole(connection_file: str | None = None, argv: list[str] | None = None) -> Popen[Any]:
    """Start a Qt console attached to this kernel (or to ``connection_file``),
    in a session of its own so an interrupt of the kernel does not reach it;
    returns its process."""
    cmd = "from qtconsole import qtconsoleapp; qtconsoleapp.main()"
    return Popen(
        [sys.executable, "-c", cmd, "--existing", _find(connection_file), *(argv or [])],
        stdout=PIPE,
        stderr=PIPE,
        close_fds=True,
        start_new_session=True,
    )
