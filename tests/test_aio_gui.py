"""asyncio while a GUI loop hosts the user run (issue 24), ``%gui tk`` / ``%gui qt``. Tier 3.

The kernel's asyncio loop is trio tasks of the user run, so it moves with
the run onto the GUI's loop and back: an asyncio task started in the plain
run keeps running while hosted, a cell awaits asyncio and trio, is
interrupted out of ``await asyncio.sleep(30)`` in both interrupt modes, and
``asyncio.run`` works in a sync cell. Fixtures and displays are
tests/test_gui.py's (Tk skips without Xvfb, Qt runs offscreen).
"""

from __future__ import annotations

import pytest
from conftest import collect_outputs
from test_gui import (  # noqa: F401  (fixtures)
    needs_qt,
    needs_tk,
    ok,
    qt_kernel,
    qt_shared,
    reply_of,
    stdout_of,
    tk_kernel,
    tk_shared,
    wait_for_marker,
    xvfb_display,
)

pytestmark = pytest.mark.timeout(180)

ASYNCIO_TICKER = """
import asyncio, trio
aio_ticks = [0]
async def aio_ticker():
    while True:
        aio_ticks[0] += 1
        await asyncio.sleep(0.01)
aio_task = asyncio.create_task(aio_ticker())
"""


def check_asyncio_while_hosted(km, kc, gui: str) -> None:
    ok(kc, ASYNCIO_TICKER)
    ok(kc, f"%gui {gui}")
    try:
        _r, out = ok(
            kc,
            "n0 = aio_ticks[0]\nawait asyncio.sleep(0.1); await trio.sleep(0.05)\n"
            "print(aio_ticks[0] > n0, asyncio.get_running_loop() is asyncio.get_event_loop())",
        )
        assert stdout_of(out) == "True True\n"
        msg_id = kc.execute("print('STARTED', flush=True)\nawait asyncio.sleep(30)")
        wait_for_marker(kc, msg_id)
        km.interrupt_kernel()
        reply = reply_of(kc, msg_id)  # within reply_of's deadline: a hang fails, a slow machine does not
        assert (reply["content"]["status"], reply["content"]["ename"]) == ("error", "KeyboardInterrupt")
        collect_outputs(kc, msg_id)
        _r, out = ok(kc, "print(asyncio.run(asyncio.sleep(0.01, 'run ok')), aio_task.done())")
        assert stdout_of(out) == "run ok False\n"
    finally:
        ok(kc, "%gui")
    _r, out = ok(kc, "n0 = aio_ticks[0]\nawait asyncio.sleep(0.1)\naio_task.cancel()\nprint(aio_ticks[0] > n0)")
    assert stdout_of(out) == "True\n"


@needs_tk
def test_asyncio_while_tk_hosts_the_run(tk_kernel):  # noqa: F811
    km, kc = tk_kernel
    check_asyncio_while_hosted(km, kc, "tk")


@needs_qt
def test_asyncio_while_qt_hosts_the_run(qt_kernel):  # noqa: F811
    km, kc = qt_kernel
    check_asyncio_while_hosted(km, kc, "qt")
