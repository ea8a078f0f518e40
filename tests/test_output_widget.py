"""ipywidgets ``Output`` and what ``get_ipython().kernel`` offers (issue 9, section 3).

Real kernel, real ipywidgets, jupyter_client client. ``Output`` captures
by syncing its ``msg_id`` to the running request's id before the block and
to ``""`` after it; the frontend then routes every output of that request
in between into the widget. The tests read those comm updates on IOPub and
check that the block's output comes between them, parented to the request
the update named: the execute_request inside a cell, the comm_msg inside a
widget callback.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import collect_outputs, execute, stdout_of

pytest.importorskip("ipywidgets")


def _opened(out: list[dict[str, Any]], model: str) -> str:
    """comm_id of the widget of ``_model_name`` ``model`` opened in ``out``."""
    ids = [
        m["content"]["comm_id"]
        for m in out
        if m["msg_type"] == "comm_open" and m["content"]["data"]["state"].get("_model_name") == model
    ]
    assert len(ids) == 1, (model, ids)
    return ids[0]


def _events(out: list[dict[str, Any]], output_comm: str) -> list[tuple[str, ...]]:
    """The Output widget's msg_id updates and the outputs, in IOPub order."""
    ev: list[tuple[str, ...]] = []
    for m in out:
        c = m["content"]
        parent = m["parent_header"].get("msg_id", "")
        if m["msg_type"] == "comm_msg" and c["comm_id"] == output_comm:
            state = c["data"].get("state", {})
            if c["data"].get("method") == "update" and "msg_id" in state:
                ev.append(("msg_id", state["msg_id"]))
        elif m["msg_type"] == "stream":
            if ev and ev[-1][0] == "stream" and ev[-1][2] == parent:  # one print may be two messages
                ev[-1] = ("stream", ev[-1][1] + c["text"], parent)
            else:
                ev.append(("stream", c["text"], parent))
        elif m["msg_type"] in ("display_data", "error"):
            ev.append((m["msg_type"], parent))
    return ev


def _comm_msg(kc: Any, comm_id: str, data: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    msg = kc.session.msg("comm_msg", {"comm_id": comm_id, "data": data})
    kc.shell_channel.send(msg)
    return msg["header"]["msg_id"], collect_outputs(kc, msg["header"]["msg_id"])


@pytest.fixture
def output_widget(kernel):
    _km, kc = kernel
    reply, out = execute(kc, "import ipywidgets as widgets\nout = widgets.Output()\ndisplay(out)")
    assert reply["content"]["status"] == "ok"
    return kc, _opened(out, "OutputModel")


def test_with_output_routes_print_and_display_into_the_widget(output_widget):
    """Issue 9's input: ``with out: print("inside")``."""
    kc, out_comm = output_widget
    msg_id = kc.execute('with out:\n    print("inside")\n    display("shown")\nprint("outside")')
    ev = _events(collect_outputs(kc, msg_id), out_comm)
    assert ev == [
        ("msg_id", msg_id),
        ("stream", "inside\n", msg_id),
        ("display_data", msg_id),
        ("msg_id", ""),
        ("stream", "outside\n", msg_id),
    ]


def test_an_error_inside_with_output_goes_into_the_widget(output_widget):
    kc, out_comm = output_widget
    msg_id = kc.execute("with out:\n    1 / 0")
    ev = _events(collect_outputs(kc, msg_id), out_comm)
    assert ev == [("msg_id", msg_id), ("error", msg_id), ("msg_id", "")]


def test_output_capture_decorator_in_a_cell_and_in_a_click_callback(output_widget):
    kc, out_comm = output_widget
    reply, out = execute(
        kc,
        "@out.capture()\n"
        "def report(*args):\n"
        "    print('captured')\n"
        "button = widgets.Button(description='go')\n"
        "button.on_click(report)\n"
        "display(button)\n"
        "report()\n",
    )
    cell = reply["parent_header"]["msg_id"]
    assert _events(out, out_comm) == [
        ("display_data", cell),  # the button
        ("msg_id", cell),
        ("stream", "captured\n", cell),
        ("msg_id", ""),
    ]
    click_id, out = _comm_msg(kc, _opened(out, "ButtonModel"), {"method": "custom", "content": {"event": "click"}})
    # in a callback the request is the comm_msg: the frontend routes its output into the widget
    assert _events(out, out_comm) == [("msg_id", click_id), ("stream", "captured\n", click_id), ("msg_id", "")]


def test_interact_routes_each_call_into_its_output(kernel):
    _km, kc = kernel
    reply, out = execute(
        kc,
        "from ipywidgets import interact\ndef f(x):\n    print(f'x={x}')\n_ = interact(f, x=5)\n",
    )
    cell = reply["parent_header"]["msg_id"]
    out_comm = _opened(out, "OutputModel")
    slider = _opened(out, "IntSliderModel")
    # the first call runs while the interact widget is displayed
    assert _events(out, out_comm) == [
        ("msg_id", cell),
        ("stream", "x=5\n", cell),
        ("msg_id", ""),
        ("display_data", cell),
    ]
    moved, out = _comm_msg(kc, slider, {"method": "update", "state": {"value": 7}, "buffer_paths": []})
    assert _events(out, out_comm) == [("msg_id", moved), ("stream", "x=7\n", moved), ("msg_id", "")]


def test_interactive_output_routes_each_call_into_its_output(kernel):
    _km, kc = kernel
    _reply, out = execute(
        kc,
        "import ipywidgets as widgets\n"
        "a = widgets.IntSlider(value=1)\n"
        "def g(a):\n"
        "    print(f'a={a}')\n"
        "shown = widgets.interactive_output(g, {'a': a})\n"
        "display(a, shown)\n",
    )
    out_comm = _opened(out, "OutputModel")
    moved, out = _comm_msg(
        kc, _opened(out, "IntSliderModel"), {"method": "update", "state": {"value": 3}, "buffer_paths": []}
    )
    assert _events(out, out_comm) == [("msg_id", moved), ("stream", "a=3\n", moved), ("msg_id", "")]


def test_with_output_in_a_thread_names_the_cell_that_started_it(output_widget):
    """A thread's request is its starting cell's (threadparent.py), here while cell B runs."""
    kc, out_comm = output_widget
    a = kc.execute(
        "import threading\n"
        "go = threading.Event()\n"
        "def f():\n"
        "    go.wait()\n"
        "    with out:\n"
        "        print('from a thread')\n"
        "t = threading.Thread(target=f); t.start()\n"
    )
    collect_outputs(kc, a)
    b = kc.execute("go.set(); t.join()")
    seen = []
    while True:
        m = kc.get_iopub_msg(timeout=30)
        if m["parent_header"].get("msg_id") in (a, b):
            seen.append(m)
        if m["parent_header"].get("msg_id") == b and m["content"].get("execution_state") == "idle":
            break
    assert _events(seen, out_comm) == [("msg_id", a), ("stream", "from a thread\n", a), ("msg_id", "")]


def test_what_get_ipython_kernel_offers(kernel):
    _km, kc = kernel
    reply, out = execute(
        kc,
        "import comm, threading\n"
        "k = get_ipython().kernel\n"
        "p = k.get_parent()\n"
        "print(p['header']['msg_id'] == p['msg_id'], p['msg_type'], p['content']['code'][:6])\n"
        "print(k._parent_header['msg_id'] == p['msg_id'], type(k.get_parent('control')).__name__)\n"
        "print(k.comm_manager is comm.get_comm_manager(), k.shell is get_ipython())\n"
        "print(k.language_info['name'], k.implementation, str(k.session) == k.session.session)\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(k.get_parent()['msg_id'])); t.start(); t.join()\n"
        "print(seen == [p['msg_id']])\n",
    )
    cell = reply["parent_header"]["msg_id"]
    assert reply["content"]["status"] == "ok", reply["content"]
    assert stdout_of(out).splitlines() == [
        "True execute_request import",
        "True dict",
        "True True",
        "python trikernel True",
        "True",
    ]
    reply, out = execute(kc, "print(k.get_parent()['msg_id'])")
    assert stdout_of(out) == reply["parent_header"]["msg_id"] + "\n" != cell + "\n"
