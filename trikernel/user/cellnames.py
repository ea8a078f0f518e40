"""The file names cells are compiled under, once the debugger has started.

JupyterLab's debugger finds a cell's breakpoints by a file name it computes
itself from ``debugInfo`` (messaging spec "Additions to the DAP",
``debugInfo``): ``tmpFilePrefix + murmur2(code, hashSeed) +
tmpFileSuffix``. The shell's compiler (shell.py ``CellCompiler``) names each
cell that way from the first start of debugpy on (debug/debugger.py sets
:data:`naming_cells`); before that IPython's own names stay, so a kernel that
never debugs shows exactly IPython's tracebacks.

Runs on: any thread (pure functions; :data:`naming_cells` is written once,
on the main thread).
"""

from __future__ import annotations

import os
import tempfile

#: The hash seed debugInfo announces (JupyterLab hashes cells with it); ipykernel's.
HASH_SEED = 0xC70F6907

#: Set (main thread) when debugpy first starts: from then on cells are
#: compiled under :func:`cell_path` names (shell.py ``CellCompiler``). Before
#: that IPython's own ``<ipython-input-…>`` names stay, so a kernel that never
#: debugs shows exactly the tracebacks it showed before.
naming_cells = False


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
    """The directory of this process's cell files: ``<tmp>/trikernel_<pid>``."""
    return os.path.join(tempfile.gettempdir(), f"trikernel_{os.getpid()}")


def cell_path(code: str) -> str:
    """The file name of a cell: ``cell_dir()/<murmur2(code, HASH_SEED)>.py``,
    what JupyterLab computes from debugInfo's prefix, seed and suffix."""
    return os.path.join(cell_dir(), f"{murmur2(code, HASH_SEED)}.py")
