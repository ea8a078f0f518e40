"""Tier 3: libraries that look for ipykernel behave as under ipykernel (issue 25).

Each test is a row of issue 25's table: the library is installed (the
``test`` extra), its code runs in a real trikernel through jupyter_client,
and the IOPub messages are those ipykernel 7.4 produces for the same cell
(measured side by side; docs/compatibility.md). The real ipykernel is
installed beside trikernel here too, so the facade's shadowing is tested as
users meet it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from conftest import TIMEOUT, execute, start_kernel, stdout_of, stop_kernel

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(scope="module")
def kc(jupyter_path: str) -> Iterator[Any]:
    km, client = start_kernel("trikernel-test-signal")
    yield client
    stop_kernel(km, client)


def run(kc: Any, code: str) -> list[dict[str, Any]]:
    """Run ``code``; returns its IOPub messages (busy to idle). Fails on an error reply."""
    r, out = execute(kc, code)
    assert r["content"]["status"] == "ok", r["content"]
    return out


def reply_to(kc: Any, msg_id: str) -> dict[str, Any]:
    while True:
        r: dict[str, Any] = kc.get_shell_msg(timeout=TIMEOUT)
        if r["parent_header"].get("msg_id") == msg_id:
            return r


def value(out: list[dict[str, Any]]) -> str:
    results = [m["content"]["data"]["text/plain"] for m in out if m["msg_type"] == "execute_result"]
    assert len(results) == 1, out
    return str(results[0])


def of_type(out: list[dict[str, Any]], msg_type: str) -> list[dict[str, Any]]:
    return [m for m in out if m["msg_type"] == msg_type]


def test_the_shell_is_ipykernels_class_by_name_and_module(kc: Any) -> None:
    out = run(
        kc, "import sys\nt = type(get_ipython())\n(t.__name__, t.__module__, 'ipykernel.zmqshell' in sys.modules)"
    )
    assert value(out) == "('ZMQInteractiveShell', 'ipykernel.zmqshell', True)"


def test_tqdm_auto_shows_a_widget_progress_bar(kc: Any) -> None:
    """tqdm.auto picks tqdm.notebook when ``ipykernel.zmqshell`` is loaded:
    a widget (comm_open, display of the widget view), no text bar on
    stderr. Before: tqdm.asyncio's text bar."""
    out = run(kc, "from tqdm.auto import tqdm\nfor _ in tqdm(range(50)): pass")
    opens = [m for m in of_type(out, "comm_open") if m["content"]["target_name"] == "jupyter.widget"]
    assert opens
    views = [
        m for m in of_type(out, "display_data") if "application/vnd.jupyter.widget-view+json" in m["content"]["data"]
    ]
    assert len(views) == 1
    assert stdout_of(out, "stderr") == ""


def test_rich_prints_html_in_a_notebook(kc: Any) -> None:
    """rich compares the shell's class name with ``ZMQInteractiveShell``.
    Before: plain text on stdout, ``is_jupyter`` False."""
    out = run(kc, "import rich\nrich.print('[bold]hi[/bold]')")
    shown = of_type(out, "display_data")
    assert len(shown) == 1
    assert "text/html" in shown[0]["content"]["data"]
    assert stdout_of(out) == ""
    assert value(run(kc, "from rich.console import Console\nConsole().is_jupyter")) == "True"


def test_plotly_uses_the_mimetype_renderer(kc: Any) -> None:
    """plotly wants the class name and a module under ``ipykernel.``. Before:
    ``plotly_mimetype+notebook``, which sends plotly.js (4.9 MB) with the
    first figure."""
    assert value(run(kc, "import plotly.io as pio\npio.renderers.default")) == "'plotly_mimetype'"
    out = run(kc, "import plotly.graph_objects as go\ngo.Figure(go.Bar(y=[1, 2])).show()")
    shown = of_type(out, "display_data")
    assert [sorted(m["content"]["data"]) for m in shown] == [["application/vnd.plotly.v1+json"]]
    assert sum(len(str(m["content"])) for m in out) < 100_000


def test_bokeh_push_notebook_opens_a_comm_and_sends_updates(kc: Any) -> None:
    """``show(p, notebook_handle=True)`` creates ``ipykernel.comm.Comm``;
    before, ``ModuleNotFoundError`` without ipykernel, and a silent comm with
    it (the real ipykernel's Comm needs its own kernel)."""
    out = run(
        kc,
        "from bokeh.io import output_notebook, show, push_notebook\n"
        "from bokeh.plotting import figure\n"
        "output_notebook(hide_banner=True)\n"
        "p = figure()\nr = p.line([1, 2], [1, 2])\n"
        "h = show(p, notebook_handle=True)",
    )
    opens = of_type(out, "comm_open")
    assert len(opens) == 1
    comm_id = opens[0]["content"]["comm_id"]
    msg_id = kc.execute(
        "for i in range(3):\n    r.data_source.data = {'x': [1, 2], 'y': [i, i]}\n    push_notebook(handle=h)"
    )
    # bokeh sends JSON text as comm data (the spec says an object): read past the schema check
    out: list[dict[str, Any]] = []
    while not out or out[-1]["msg_type"] != "status" or out[-1]["content"]["execution_state"] != "idle":
        m = kc.iopub_channel.get_msg(timeout=TIMEOUT)
        if m["parent_header"].get("msg_id") == msg_id:
            out.append(m)
    assert reply_to(kc, msg_id)["content"]["status"] == "ok"
    updates = [m for m in of_type(out, "comm_msg") if m["content"]["comm_id"] == comm_id]
    assert len(updates) == 9  # three pushes, three messages each (header, metadata, content), as ipykernel


def test_session_send_on_iopub_socket_displays(kc: Any) -> None:
    """The ipywidgets#1844 pattern (nbclient's update-display-id notebook).
    Before: ``AttributeError: 'str' object has no attribute 'send'``."""
    out = run(
        kc,
        "ip = get_ipython()\n"
        "k = ip.kernel\n"
        "sent = k.session.send(k.iopub_socket, 'display_data',\n"
        "    {'data': {'text/plain': 'hi'}, 'metadata': {}, 'transient': {'display_id': 'd1'}},\n"
        "    parent=ip.parent_header)\n"
        "sent['msg_type'], str(k.session) == k.session.session, k.execution_count == ip.execution_count",
    )
    shown = of_type(out, "display_data")
    assert [m["content"]["data"] for m in shown] == [{"text/plain": "hi"}]
    assert shown[0]["content"]["transient"] == {"display_id": "d1"}
    assert value(out) == "('display_data', True, True)"


def test_the_facade_shadows_the_real_ipykernel_and_starts_nothing(kc: Any) -> None:
    """Importing the modules of ipykernel that have side effects starts no
    thread and leaves ``comm.create_comm`` trikernel's: a widget made
    afterwards still opens its comm (before: silent, the real ipkernel
    module had replaced create_comm)."""
    out = run(
        kc,
        "import threading, comm\n"
        "before = sorted(t.name for t in threading.enumerate())\n"
        "import ipykernel, ipykernel.kernelapp, ipykernel.ipkernel, ipykernel.kernelbase, ipykernel.comm\n"
        "import ipykernel.iostream, ipykernel.connect, ipykernel.embed, ipykernel.jsonutil\n"
        "after = sorted(t.name for t in threading.enumerate())\n"
        "print(before == after, comm.create_comm.__module__, ipykernel.kernelapp.IPKernelApp.initialized(),\n"
        "      ipykernel.get_connection_file() == get_ipython().config.IPKernelApp.connection_file,\n"
        "      ipykernel.version_info >= (6, 18), isinstance(get_ipython().kernel, ipykernel.kernelbase.Kernel))\n"
        "import ipywidgets\n"
        "w = ipywidgets.IntSlider()",
    )
    assert stdout_of(out) == "True trikernel.user.comms True True True True\n"
    assert [m["content"]["target_name"] for m in of_type(out, "comm_open")]
    r, out = execute(kc, "import ipykernel.embed\nipykernel.embed.embed_kernel()")
    assert r["content"]["ename"] == "RuntimeError"
    assert "second kernel" in r["content"]["evalue"]


def test_kernel_attributes_trikernel_cannot_offer_say_so(kc: Any) -> None:
    r, _out = execute(kc, "get_ipython().kernel.do_one_iteration()")
    assert r["content"]["ename"] == "AttributeError"
    assert "'do_one_iteration' in trikernel" in r["content"]["evalue"]
    assert value(run(kc, "hasattr(get_ipython().kernel, 'io_loop')")) == "False"


def test_shell_set_parent_routes_a_threads_output_to_a_cell(kc: Any) -> None:
    """ipykernel 7's recipe for a background thread's output (ipywidgets#4020):
    ``shell.set_parent(parent)`` in the thread, with another cell's request."""
    first = run(kc, "ip = get_ipython()\nfirst = ip.get_parent()\nfirst['msg_type']")
    assert value(first) == "'execute_request'"
    first_id = first[0]["parent_header"]["msg_id"]
    msg_id = kc.execute(
        "import threading\n"
        "def work():\n"
        "    ip.set_parent(first)\n"
        "    print('to the first cell')\n"
        "t = threading.Thread(target=work)\nt.start()\nt.join()"
    )
    seen: list[dict[str, Any]] = []
    while (
        not seen
        or seen[-1]["parent_header"].get("msg_id") != msg_id
        or seen[-1]["msg_type"] != "status"
        or (seen[-1]["content"]["execution_state"] != "idle")
    ):
        seen.append(kc.get_iopub_msg(timeout=TIMEOUT))
    by_parent = {m["parent_header"].get("msg_id"): m for m in seen if m["msg_type"] == "stream"}
    assert list(by_parent) == [first_id]
    assert by_parent[first_id]["content"]["text"] == "to the first cell\n"


def test_kernel_get_parent_of_control_and_set_parent(kc: Any) -> None:
    """``kernel.get_parent("control")`` is the latest control request
    (ipykernel's test_parent_header_and_ident); ``kernel.set_parent(ident,
    parent)`` re-parents this context's output (jupyter_dash)."""
    kc.kernel_info()  # on shell; now one on control
    msg = kc.session.msg("kernel_info_request", {})
    kc.control_channel.send(msg)
    assert kc.get_control_msg(timeout=TIMEOUT)["parent_header"]["msg_id"] == msg["header"]["msg_id"]
    out = run(kc, "get_ipython().kernel.get_parent('control')['header']['msg_id']")
    assert value(out) == repr(msg["header"]["msg_id"])
