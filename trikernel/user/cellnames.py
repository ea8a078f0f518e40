"""The file names cells are compiled under, as ipykernel names them.

JupyterLab's debugger finds a cell's breakpoints by a file name it computes
itself from ``debugInfo`` (messaging spec "Additions to the DAP",
``debugInfo``): ``tmpFilePrefix + murmur2(code, hashSeed) +
tmpFileSuffix``; from JupyterLab 4.5 it shows a breakpoint or a stack frame
as ``Cell [n]`` only for paths containing ``ipykernel_``
(``DebuggerDisplayRegistry``), else the raw path. So, as ipykernel's
``XCachingCompiler`` does, every cell from the first one on is compiled as
``<tmp>/ipykernel_<pid>/<murmur2>.py`` (shell.py ``CellCompiler``), and
``$IPYKERNEL_CELL_NAME``, read at each compile, wins (nbclient's tests set
it to ``<IPY-INPUT>``, VS Code's Interactive Window per cell). IPython's
tracebacks still say ``Cell In[n]``; with a path-like name they show five
context lines, as ipykernel's (three for ``<...>`` names). joblib's cache
keys strip the ``ipykernel_<pid>`` folder.

Runs on: any thread (pure functions of the code, the pid and the environment).
"""

from __future__ import annotations

import os
import tempfile

#: The hash seed debugInfo announces (JupyterLab hashes cells with it); ipykernel's.
HASH_SEED = 0xC70F6907

#: The environment variable whose value, when set, is every cell's file name (ipykernel's).
CELL_NAME_ENV = "IPYKERNEL_CELL_NAME"


def murmur2(data: str, seed: int) -> int:
    """MurmurHash2 (x86, 32 bit) of ``data``'s UTF-8 bytes: the cell hash of
    debugInfo's ``hashMethod: "Murmur2"`` (JupyterLab's ``murmur2`` and
    ipykernel's ``murmur2_x86``).

    Returns:
        An unsigned 32-bit int.
    """
    m = 0x5BD1E995
    b = data.encode("utf-8")
    n = len(b)
    h = (seed ^ n) & 0xFFFFFFFF
    end = n & ~3
    for i in range(0, end, 4):
        k = b[i] | (b[i + 1] << 8) | (b[i + 2] << 16) | (b[i + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest = n & 3
    if rest:
        k = 0
        if rest == 3:
            k ^= b[end + 2] << 16
        if rest >= 2:
            k ^= b[end + 1] << 8
        k ^= b[end]
        h = ((h ^ k) * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def cell_dir() -> str:
    """The directory of this process's cell files: ``<tmp>/ipykernel_<pid>``
    (ipykernel's ``get_tmp_directory``; JupyterLab keys on ``ipykernel_``)."""
    return os.path.join(tempfile.gettempdir(), f"ipykernel_{os.getpid()}")


def cell_path(code: str) -> str:
    """The file name of a cell: ``$IPYKERNEL_CELL_NAME`` when set, else
    ``cell_dir()/<murmur2(code, HASH_SEED)>.py``, what JupyterLab computes
    from debugInfo's prefix, seed and suffix (ipykernel's ``get_file_name``)."""
    return os.environ.get(CELL_NAME_ENV) or os.path.join(cell_dir(), f"{murmur2(code, HASH_SEED)}.py")
