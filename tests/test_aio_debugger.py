"""The debugger in cells and tasks that await asyncio (issue 24). Tier 3: a real kernel, debugpy.

A breakpoint stops in a cell after it awaited asyncio, in an ``async def``
that awaits both flavours, inside an asyncio task (a mixed task: a trio
task drives it, on the main thread, where debugpy traces) and in a loop
callback (run by trio-asyncio's loop driver). The call stack
shows no kernel machinery (trio-asyncio's frames are hidden like trio's),
and the frame's locals are read. Fixtures and the session helper are
tests/test_debugger.py's.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
from test_debugger import _machinery_dirs, debug_specs, session  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(120)

CELLS = {
    "top_level_asyncio_await": ("import asyncio\nawait asyncio.sleep(0.01)\na = 2\nb = a + 1\n", 4, "<module>"),
    "async_def_awaiting_both": (
        "import asyncio, trio\n"
        "async def g():\n"
        "    await asyncio.sleep(0.01)\n"
        "    a = 2\n"
        "    await trio.sleep(0)\n"
        "    return a\n"
        "\n"
        "await g()\n",
        5,
        "g",
    ),
    "asyncio_task": (
        "import asyncio\n"
        "async def job():\n"
        "    a = 2\n"
        "    await asyncio.sleep(0.01)\n"
        "    b = a + 1\n"
        "\n"
        "t = asyncio.create_task(job())\n"
        "await t\n",
        5,
        "job",
    ),
    "loop_callback": (
        "import asyncio\n"
        "def cb():\n"
        "    a = 2\n"
        "    b = a + 1\n"
        "\n"
        "asyncio.get_running_loop().call_soon(cb)\n"
        "await asyncio.sleep(0.01)\n",
        4,
        "cb",
    ),
}


@pytest.mark.parametrize("kind", list(CELLS))
def test_a_breakpoint_stops_in_code_that_awaits_asyncio(session, kind):  # noqa: F811
    src, line, name = CELLS[kind]
    msg_id, path, thread_id = session.stop_at(src, line)
    frames = session.frames(thread_id)
    top = frames[0]
    assert (top["line"], top["name"]) == (line, name), frames
    spec = importlib.util.find_spec("trio_asyncio")  # not imported here: it changes asyncio process-wide
    assert spec is not None
    assert spec.submodule_search_locations
    hidden = (*_machinery_dirs(), spec.submodule_search_locations[0] + os.sep)
    shown = [f.get("source", {}).get("path", "") for f in frames]
    assert not [p for p in shown if p.startswith(hidden)], shown
    assert session.locals_of(top["id"])["a"]["value"] == "2"
    assert session.resume(thread_id, msg_id)["status"] == "ok"
    session.ok("setBreakpoints", {"breakpoints": [], "source": {"path": path}})
