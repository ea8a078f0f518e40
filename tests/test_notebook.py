"""nbclient (`jupyter execute`) runs the README's tour notebook on trikernel,
classically, through the JEP 66 provisioner, and installed as the default
``python3`` kernel; papermill runs a parameterized notebook on it."""

from __future__ import annotations

import os
import re
import subprocess

import nbformat
import pytest
from conftest import install_kernelspec, which

pytestmark = pytest.mark.timeout(180)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOUR = os.path.join(ROOT, "examples", "tour.ipynb")


def _run(kernel_name: str, out: str, env: dict[str, str] | None = None) -> nbformat.NotebookNode:
    r = subprocess.run(
        [which("jupyter"), "execute", f"--kernel_name={kernel_name}", TOUR, "--output", out],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return nbformat.read(out, as_version=4)


def _check(nb: nbformat.NotebookNode) -> None:
    texts = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for o in cell.outputs:
            if o.output_type == "error":
                assert "raises-exception" in cell.metadata.get("tags", []), cell.source
            texts.append(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")))
    joined = "\n".join(texts)
    for needle in (
        "hello from trikernel",
        "caught: ZeroDivisionError",
        "awaited without any magic",
        "ROUND TRIP THROUGH TRIO",
        "gathered [4, 9]",
        "the task of the last cell returned 16",
        "['b', 'c', 'a'] in ",  # sorted by delay; the seconds it prints depend on the machine's load
    ):
        assert needle in joined, needle
    # at least its third tick: the ticker may tick again (50 ms on) before the
    # waiting cell prints, on a loaded machine
    assert re.search(r"the background ticker reached [345]\b", joined), joined


def test_tour_runs_with_jupyter_execute(tmp_path):
    _check(_run("trikernel", str(tmp_path / "out.ipynb")))


def test_tour_runs_through_the_handshake_provisioner(tmp_path):
    env = dict(os.environ, JUPYTER_PATH=install_kernelspec(tmp_path / "prefix", "trikernel-hs", "--handshake"))
    _check(_run("trikernel-hs", str(tmp_path / "out.ipynb"), env=env))


@pytest.fixture
def as_python3(tmp_path):
    """trikernel installed as the default Python kernel, ``python3``, as a user
    would (``python -m trikernel install --name python3``): nbclient then adds
    ``--HistoryManager.hist_file=:memory:`` to its command line, which stopped
    trikernel's start-up before issue 25 ("Kernel died before replying to
    kernel_info")."""
    return dict(os.environ, JUPYTER_PATH=install_kernelspec(tmp_path / "prefix", "python3"))


def test_jupyter_execute_runs_a_notebook_on_trikernel_installed_as_python3(tmp_path, as_python3):
    _check(_run("python3", str(tmp_path / "out.ipynb"), env=as_python3))


def _papermill(src: str, out: str, env: dict[str, str], *args: str) -> None:
    """Run papermill on ``src`` (its ``python3`` kernel is trikernel in ``env``); it must succeed."""
    r = subprocess.run(
        [which("papermill"), src, out, *args, "--no-progress-bar"],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]


def test_papermill_runs_a_notebook_on_trikernel_installed_as_python3(tmp_path, as_python3):
    """papermill's own job: a parameters cell, overridden with ``-p``. (The tour
    has a cell that fails on purpose, which papermill stops at, as for any
    kernel.)"""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("from tqdm.auto import tqdm\nprint(x + 1, get_ipython().kernel.implementation)"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    src, out = str(tmp_path / "in.ipynb"), str(tmp_path / "out.ipynb")
    nbformat.write(nb, src)
    _papermill(src, out, as_python3, "-p", "x", "41")
    cells = nbformat.read(out, as_version=4).cells
    assert "".join(o.get("text", "") for o in cells[-1].outputs) == "42 trikernel\n"


BACKGROUND_FAILURES = [
    # the reviewer's cell: an asyncio task's exception nobody retrieved
    "import asyncio, gc\n"
    "async def failing():\n"
    "    raise RuntimeError('task failed')\n"
    "t = asyncio.create_task(failing())\n"
    "await asyncio.sleep(0.1)\n"
    "del t\n"
    "gc.collect()",
    # a trikernel.nursery task's exception
    "import trio\n"
    "done = trio.Event()\n"
    "async def boom():\n"
    "    try:\n"
    "        raise ValueError('nursery boom')\n"
    "    finally:\n"
    "        done.set()\n"
    "nursery.start_soon(boom)\n"
    "await done.wait()\n"
    "await trio.sleep(0)",
    # a thread's (Python's threading.excepthook)
    "import threading\n"
    "def f():\n"
    "    raise KeyError('thread boom')\n"
    "th = threading.Thread(target=f)\n"
    "th.start()\n"
    "th.join()",
    "print('the end')",
]


def test_papermill_passes_a_notebook_whose_background_work_fails(tmp_path, as_python3):
    """A failure in the background (an asyncio task nobody awaited, a
    trikernel.nursery task, a thread) is not the cell's own: it is stderr
    text of the cell that started it, as ipykernel writes an asyncio task's
    (asyncio logs it, logging's last resort writes it to sys.stderr) and
    Python a thread's. papermill fails a notebook for any ``error`` output,
    although each cell's reply is ok: the first cell failed this notebook,
    which passes on ipykernel, when the task's error was an ``error`` output."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in BACKGROUND_FAILURES]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    src, out = str(tmp_path / "in.ipynb"), str(tmp_path / "out.ipynb")
    nbformat.write(nb, src)
    _papermill(src, out, as_python3)
    cells = nbformat.read(out, as_version=4).cells
    assert [o.output_type for c in cells for o in c.outputs if o.output_type == "error"] == []

    def stderr(cell: nbformat.NotebookNode) -> str:
        return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stderr")

    task, nursery_task, thread = (stderr(c) for c in cells[:3])
    assert task.startswith("Task exception was never retrieved\nfuture: <Task finished"), task
    assert "Traceback (most recent call last):" in task, task
    assert "RuntimeError: task failed" in task, task
    assert nursery_task.startswith("Exception in trikernel.nursery task __main__.boom:\nTraceback"), nursery_task
    assert "ValueError: nursery boom" in nursery_task, nursery_task
    assert thread.startswith("Exception in thread"), thread
    assert "KeyError: 'thread boom'" in thread, thread
    assert "".join(o.get("text", "") for o in cells[-1].outputs) == "the end\n"
