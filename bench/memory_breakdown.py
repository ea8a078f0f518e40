"""What a kernel's RSS is made of, measured from inside it (issue 26; docs/robustness.md,
"What the memory is").

:data:`CELL` is Python code run in the kernel as a cell (any IPython kernel: trikernel,
ipykernel); it prints one line ``BREAKDOWN {json}`` with MiB figures:

- ``rss``: the process's resident set (``/proc/self/status`` VmRSS); ``peak``: VmHWM;
- ``file``: resident file-backed mappings (code, shared libraries);
- ``python_objects``: bytes in pymalloc's allocated blocks (Python objects up to 512
  bytes, most of them); ``pymalloc_free``: the rest of pymalloc's 1 MiB arenas (free
  blocks, unused pools: fragmentation);
- ``malloc_in_use`` / ``malloc_free``: glibc's ``mallinfo2`` (all arenas; large Python
  objects, libzmq's messages and everything else malloc'd), free counting what glibc
  holds whether resident or not;
- ``main_heap``: resident ``[heap]`` (glibc's main arena); ``thread_arenas``: resident
  anonymous mappings at 64 MiB-aligned addresses (glibc's per-thread arenas, whose top
  ``malloc_trim`` never returns);
- ``other``: what is left (thread stacks, other anonymous mappings).

Linux with glibc only (``mallinfo2`` needs glibc 2.33); elsewhere the line says why not.
The cell collects garbage first and changes nothing else (no trim).
"""

from __future__ import annotations

import json
from typing import Any

CELL = r"""
def _trikernel_breakdown():
    import ctypes, gc, json, os, re, sys, tempfile
    M = 2 ** 20
    gc.collect()
    out = {}
    with open("/proc/self/status") as f:
        st = dict(line.split(":", 1) for line in f if ":" in line)
    out["rss"] = int(st["VmRSS"].split()[0]) / 1024
    out["peak"] = int(st["VmHWM"].split()[0]) / 1024
    file_rss = heap = arenas = 0
    cur = None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if parts and "-" in parts[0] and ":" not in parts[0] and len(parts) >= 5:
                start = int(parts[0].split("-")[0], 16)
                cur = (start, parts[5] if len(parts) > 5 else "")
            elif parts and parts[0] == "Rss:" and cur is not None:
                kb = int(parts[1])
                if cur[1] == "[heap]":
                    heap += kb
                elif cur[1] and not cur[1].startswith("["):
                    file_rss += kb
                elif not cur[1] and cur[0] % (64 * M) == 0:
                    arenas += kb
    out.update(file=file_rss / 1024, main_heap=heap / 1024, thread_arenas=arenas / 1024)
    fd, path = tempfile.mkstemp()
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
    with open(path) as f:
        text = f.read()
    os.unlink(path)
    n = re.search(r"arenas allocated current\s+=\s+([\d,]+)", text)
    live = re.search(r"bytes in allocated blocks\s+=\s+([\d,]+)", text)
    if n and live:
        size = re.search(r"arenas \* ([\d,]+) bytes/arena", text)
        arena = int(size.group(1).replace(",", "")) if size else M
        out["python_objects"] = int(live.group(1).replace(",", "")) / M
        out["pymalloc_free"] = (int(n.group(1).replace(",", "")) * arena) / M - out["python_objects"]
    try:
        class _MI(ctypes.Structure):
            _fields_ = [(k, ctypes.c_size_t) for k in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = _MI
        mi = libc.mallinfo2()
        out["malloc_in_use"] = (mi.uordblks + mi.hblkhd) / M
        out["malloc_free"] = mi.fordblks / M
    except (OSError, AttributeError) as exc:
        out["malloc"] = f"no mallinfo2: {exc}"
    known = out["file"] + out["main_heap"] + out["thread_arenas"]
    known += out.get("python_objects", 0) + out.get("pymalloc_free", 0)
    out["other"] = out["rss"] - known
    print("BREAKDOWN " + json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}))
try:
    _trikernel_breakdown()
except Exception as _exc:
    print("BREAKDOWN " + __import__("json").dumps({"error": repr(_exc)}))
del _trikernel_breakdown
"""


def parse(text: str) -> dict[str, Any] | None:
    """The figures :data:`CELL` printed in ``text`` (its stream output), or None."""
    for line in text.splitlines():
        if line.startswith("BREAKDOWN "):
            return dict(json.loads(line[len("BREAKDOWN ") :]))
    return None
