"""Regressions found by review: each was a real defect a user could hit."""

from __future__ import annotations

import time
import uuid

import pytest
from conftest import TIMEOUT, collect_outputs, execute, start_kernel, stdout_of, stop_kernel, wait_for_marker

pytestmark = pytest.mark.timeout(120)


def result_text(out):
    return [m["content"]["data"]["text/plain"] for m in out if m["msg_type"] == "execute_result"]


def test_lone_surrogates_in_output_do_not_kill_the_kernel(kernel):
    """A non-UTF-8 filename (surrogateescape) printed used to end the io run."""
    km, kc = kernel
    r, out = execute(kc, "print('caf\\udcff.txt')")
    assert r["content"]["status"] == "ok"
    assert stdout_of(out) == "caf\ufffd.txt\n"
    r, out = execute(kc, "raise ValueError('bad \\udcff byte')")
    assert r["content"]["ename"] == "ValueError"
    assert [m["content"]["ename"] for m in out if m["msg_type"] == "error"] == ["ValueError"]
    assert km.is_alive()


def test_cancelling_the_user_nursery_keeps_the_kernel(kernel):
    _km, kc = kernel
    execute(
        kc,
        "import trio\nstopped = []\n"
        "async def forever():\n    try:\n        await trio.sleep_forever()\n    finally:\n        stopped.append(1)\n"
        "nursery.start_soon(forever)\nawait trio.sleep(0.05)",
    )
    r, _ = execute(kc, "nursery.cancel_scope.cancel()\nawait trio.sleep(0.05)")
    assert r["content"]["status"] == "ok"
    r, out = execute(
        kc,
        "done = trio.Event()\nasync def again():\n    done.set()\n"
        "nursery.start_soon(again)\nawait done.wait()\nlen(stopped)",
    )
    assert r["content"]["status"] == "ok"
    assert result_text(out) == ["1"]


def test_control_answers_during_a_print_flood(jupyter_path):
    """The iopub task used to run without a checkpoint while the queue stayed full."""
    km, kc = start_kernel("trikernel-test-message")
    try:
        msg_id = kc.execute("while True:\n    print('STARTED' + 'x' * 100)")
        wait_for_marker(kc, msg_id)  # the flood is on
        # the flood never ends by itself: answered at all is answered during it
        ki = kc.session.msg("kernel_info_request")
        kc.control_channel.send(ki)
        while kc.get_control_msg(timeout=TIMEOUT)["parent_header"]["msg_id"] != ki["header"]["msg_id"]:
            pass
        km.interrupt_kernel()  # interrupt_request on control (message mode)
        while True:
            r = kc.get_shell_msg(timeout=TIMEOUT)
            if r["parent_header"].get("msg_id") == msg_id:
                break
        assert r["content"]["ename"] == "KeyboardInterrupt"
    finally:
        stop_kernel(km, kc)


def test_user_logging_reaches_the_notebook(kernel):
    _km, kc = kernel
    _r, out = execute(
        kc, "import logging\nlogging.warning('from the root logger')\nlogging.getLogger('mylib').error('from mylib')"
    )
    err = stdout_of(out, "stderr")
    assert "from the root logger" in err
    assert "from mylib" in err
    _r, out = execute(kc, "logging.basicConfig(level=logging.INFO, force=True)\nlogging.info('configured by the user')")
    assert "configured by the user" in stdout_of(out, "stderr")
    execute(kc, "logging.basicConfig(force=True, handlers=[logging.NullHandler()])")


def test_forked_children_do_not_block_on_the_kernels_queue(kernel):
    _km, kc = kernel
    code = (
        "import multiprocessing as mp, sys\n"
        "def chatty(n):\n"
        "    for i in range(n):\n"
        "        print('o', i); print('e', i, file=sys.stderr)\n"
        "    return n\n"
        "with mp.get_context('fork').Pool(1) as p:\n"
        "    n = p.apply_async(chatty, (3000,)).get(timeout=30)\n"
        "n"
    )
    r, out = execute(kc, code, timeout=60)
    assert r["content"]["status"] == "ok"
    assert result_text(out) == ["3000"]


def test_a_looping_comm_handler_can_be_interrupted(jupyter_path):
    km, kc = start_kernel("trikernel-test-signal")
    try:
        execute(
            kc,
            "import comm\n"
            "def target(c, msg):\n"
            "    def spin(m):\n"
            "        print('STARTED', flush=True)\n"
            "        while True:\n"
            "            pass\n"
            "    c.on_msg(spin)\n"
            "comm.get_comm_manager().register_target('spin', target)",
        )
        cid = uuid.uuid4().hex
        op = kc.session.msg("comm_open", {"comm_id": cid, "target_name": "spin", "data": {}})
        kc.shell_channel.send(op)
        collect_outputs(kc, op["header"]["msg_id"])
        m = kc.session.msg("comm_msg", {"comm_id": cid, "data": {}})
        kc.shell_channel.send(m)
        wait_for_marker(kc, m["header"]["msg_id"])  # the handler spins now
        km.interrupt_kernel()
        collect_outputs(kc, m["header"]["msg_id"])  # the comm_msg's idle comes
        _r, out = execute(kc, "'alive'")
        assert result_text(out) == ["'alive'"]
    finally:
        stop_kernel(km, kc)


def test_interrupt_during_to_thread_is_the_cells(jupyter_path):
    km, kc = start_kernel("trikernel-test-signal")
    try:
        msg_id = kc.execute(
            "import time, trio\nprint('STARTED', flush=True)\n"
            "await trio.to_thread.run_sync(time.sleep, 2)\nprint('after the thread')"
        )
        wait_for_marker(kc, msg_id)
        km.interrupt_kernel()
        out = collect_outputs(kc, msg_id)
        while True:
            r = kc.get_shell_msg(timeout=TIMEOUT)
            if r["parent_header"].get("msg_id") == msg_id:
                break
        assert r["content"]["ename"] == "KeyboardInterrupt"
        assert any(x["msg_type"] == "error" for x in out)
        r, out = execute(kc, "'next'")
        assert result_text(out) == ["'next'"]
    finally:
        stop_kernel(km, kc)


def test_streams_have_a_real_fileno(kernel):
    _km, kc = kernel
    r, _ = execute(
        kc,
        "import faulthandler, subprocess, sys\nfaulthandler.enable()\n"
        "subprocess.run(['true'], stdout=sys.stdout, check=True)",
    )
    assert r["content"]["status"] == "ok"


def test_odd_but_harmless_request_fields(kernel):
    _km, kc = kernel
    msg = kc.session.msg(
        "execute_request",
        {
            "code": "1",
            "silent": False,
            "store_history": True,
            "user_expressions": ["not", "a", "dict"],
            "allow_stdin": False,
        },
    )
    kc.shell_channel.send(msg)
    r = kc.get_shell_msg(timeout=TIMEOUT)
    while r["parent_header"]["msg_id"] != msg["header"]["msg_id"]:
        r = kc.get_shell_msg(timeout=TIMEOUT)
    assert r["content"]["status"] == "ok"
    kc.history(hist_access_type="tail", n=None)
    assert kc.get_shell_msg(timeout=TIMEOUT)["content"]["status"] == "ok"


def _stream_text_until(kc, needle: str, timeout: float = 15) -> str:
    """All stream text read from IOPub until ``needle`` shows up (bounded wait)."""
    seen = ""
    deadline = time.monotonic() + timeout
    while needle not in seen and time.monotonic() < deadline:
        try:
            m = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:
            break
        if m["msg_type"] == "stream":
            seen += m["content"]["text"]
    return seen


def test_fd_level_output_reaches_the_notebook(kernel):
    """subprocess, os.system and C-level writes go to fds 1/2, captured as in ipykernel."""
    _km, kc = kernel
    kc.execute(
        "import subprocess, os\nsubprocess.run(['echo', 'from a subprocess'], check=True)\n"
        "os.system('echo from os.system >&2')"
    )
    text = _stream_text_until(kc, "from os.system")
    assert "from a subprocess" in text
    assert "from os.system" in text


def test_forked_child_output_reaches_the_notebook(kernel):
    _km, kc = kernel
    kc.execute(
        "import multiprocessing as mp\n"
        "def hello():\n    print('hello from the child')\n"
        "p = mp.get_context('fork').Process(target=hello); p.start(); p.join(10)"
    )
    assert "hello from the child" in _stream_text_until(kc, "hello from the child")


def test_kernel_log_stays_out_of_the_notebook(tmp_path, jupyter_path):
    """With fds captured, the kernel's own log still goes to its real stderr."""
    err = open(tmp_path / "kernel.err", "w")  # noqa: SIM115 - the kernel writes it; closed below
    km, kc = start_kernel("trikernel-test-signal", stderr=err)
    try:
        _r, out = execute(kc, "import logging\nlogging.getLogger('trikernel.test').warning('kernel-side line')")
        assert "kernel-side line" not in stdout_of(out, "stderr")
    finally:
        stop_kernel(km, kc)
        err.close()
    assert "kernel-side line" in (tmp_path / "kernel.err").read_text()


def assert_held_cell(mine):
    """The IOPub messages of a ``print(6 * 7)`` cell, all there and in order:
    busy, execute_input, its text, idle. The text may come in more than one
    ``stream`` message: the spec lets a kernel split a stream anywhere, and
    under load ``42`` and the newline can leave apart (CI, once)."""
    types = [m["msg_type"] for m in mine]
    assert types[:2] == ["status", "execute_input"], types
    assert types[-1] == "status", types
    assert set(types[2:-1]) == {"stream"}, types
    assert [mine[0]["content"]["execution_state"], mine[-1]["content"]["execution_state"]] == ["busy", "idle"]
    assert "".join(m["content"]["text"] for m in mine[2:-1]) == "42\n"


def test_a_client_that_subscribes_late_gets_the_first_cells_messages(jupyter_path):
    """CI: ``jupyter console`` hung at ``In [1]:``. It connects its channels,
    takes a ``kernel_info_reply`` on shell as ready and sends the first
    ``execute_request`` at once; its SUB socket could join after that cell's
    busy, output and idle were published (a plain PUB drops them;
    jupyter_client#593), and it waited for idle for ever. Here the client
    subscribes only after the cell's reply, so the kernel must have held the
    messages for it (server/iopubtask.py, "Before the first subscriber")."""
    km, kc = start_kernel("trikernel-test-signal", iopub=False)
    try:
        msg_id = kc.execute("print(6 * 7)")
        deadline = time.monotonic() + TIMEOUT
        while True:
            reply = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        assert reply["content"]["status"] == "ok"
        got = []  # only now is the client's SUB socket made and connected

        def idle(m):
            return m["parent_header"].get("msg_id") == msg_id and m["content"].get("execution_state") == "idle"

        while not (got and idle(got[-1])):
            got.append(kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic())))
        assert got[0]["msg_type"] == "iopub_welcome"
        mine = [m for m in got if m["parent_header"].get("msg_id") == msg_id]
        assert_held_cell(mine)
        # what came before: the kernel's start and the kernel_info that made the client call it ready
        assert [m["content"].get("execution_state") for m in got[1:] if m["msg_type"] == "status"][:1] == ["starting"]
    finally:
        stop_kernel(km, kc)


def test_an_input_request_waits_for_a_stdin_channel_that_joins_late(jupyter_path):
    """The same kind as the late IOPub subscriber: the client's stdin socket
    joins after the cell has called ``input()``. The ROUTER cannot route the
    ``input_request`` yet (EHOSTUNREACH); it used to be dropped, and the cell
    waited for ever for an answer that could not come. Now it is retried
    until the socket joins (stdinbridge.ROUTE_TIMEOUT)."""
    km, kc = start_kernel("trikernel-test-signal", stdin=False)
    try:
        msg_id = kc.execute("print('STARTED', flush=True)\nname = input('who? ')\nprint('hi', name)", allow_stdin=True)
        wait_for_marker(kc, msg_id)  # input() is being called
        time.sleep(0.3)  # a few of the kernel's delivery attempts fail meanwhile
        req = kc.get_stdin_msg(timeout=TIMEOUT)  # the stdin socket is made and connects only now
        assert req["msg_type"] == "input_request"
        assert req["parent_header"]["msg_id"] == msg_id
        kc.input("trio")
        out = collect_outputs(kc, msg_id)
        assert stdout_of(out) == "hi trio\n"
    finally:
        stop_kernel(km, kc)


def test_an_input_request_nobody_can_receive_fails_the_input_call(jupyter_path):
    """A client that says ``allow_stdin`` but never connects a stdin socket:
    after ROUTE_TIMEOUT (5 s) ``input()`` raises StdinNotImplementedError, as
    with ``allow_stdin: false``, instead of waiting for ever."""
    km, kc = start_kernel("trikernel-test-signal", stdin=False)
    try:
        t0 = time.monotonic()
        reply, _ = execute(kc, "input('who? ')", allow_stdin=True)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "StdinNotImplementedError"
        assert "did not connect" in reply["content"]["evalue"]
        assert time.monotonic() - t0 >= 4.9
        r, _ = execute(kc, "1 + 1")
        assert r["content"]["status"] == "ok"
    finally:
        stop_kernel(km, kc)


def test_a_client_that_subscribes_after_every_other_left_gets_what_came_between(jupyter_path):
    """The same race for a client that connects later (``jupyter console
    --existing`` on a kernel nobody else watches): once its only client's SUB
    socket has gone (the kernel counts the XPUB's connections with a socket
    monitor), the kernel holds IOPub again, and the next subscriber gets it."""
    km, kc = start_kernel("trikernel-test-signal")
    kc2 = None
    try:
        kc.iopub_channel.close()  # the only subscriber leaves; shell stays
        holding = "get_ipython().run_line_magic('trikernel', '--return')['iopub_holding']"
        deadline = time.monotonic() + TIMEOUT
        while True:  # asked on shell: IOPub has no subscriber to tell
            msg_id = kc.execute("", user_expressions={"h": holding})
            reply = kc.get_shell_msg(timeout=TIMEOUT)
            assert reply["parent_header"]["msg_id"] == msg_id
            if reply["content"]["user_expressions"]["h"]["data"]["text/plain"] == "True":
                break
            assert time.monotonic() < deadline, "the kernel never saw the subscriber leave"
            time.sleep(0.05)
        msg_id = kc.execute("print(6 * 7)")
        reply = kc.get_shell_msg(timeout=TIMEOUT)
        assert (reply["parent_header"]["msg_id"], reply["content"]["status"]) == (msg_id, "ok")
        kc2 = km.client()
        kc2.start_channels()  # a new client subscribes only now
        got = []
        while not (got and got[-1]["parent_header"].get("msg_id") == msg_id and got[-1]["msg_type"] == "status"
                   and got[-1]["content"]["execution_state"] == "idle"):  # fmt: skip
            got.append(kc2.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic())))
        assert got[0]["msg_type"] == "iopub_welcome"
        mine = [m for m in got if m["parent_header"].get("msg_id") == msg_id]
        assert_held_cell(mine)
    finally:
        if kc2 is not None:
            kc2.stop_channels()
        stop_kernel(km, kc)


def test_with_no_hold_many_iopub_connections_do_not_stall_the_kernel(jupyter_path):
    """``--iopub-hold-bytes 0`` used to leave the XPUB's socket monitor unread:
    libzmq's monitor_event sends without ZMQ_DONTWAIT, so once about 2000
    events (sndhwm + rcvhwm of the inproc pipe) were waiting, it blocked the
    context's one I/O thread for good, and shell, control and IOPub stopped
    (about 1000 connections that came and went: reconnecting clients, probes)."""
    import socket

    from conftest import make_kernelspec

    make_kernelspec(jupyter_path, "trikernel-test-nohold", extra_argv=["--iopub-hold-bytes", "0"])
    km, kc = start_kernel("trikernel-test-nohold")
    try:
        port = km.get_connection_info()["iopub_port"]
        cycles = 0
        while cycles < 1500:  # in batches: connect 100, then close them
            batch = []
            try:
                for _ in range(100):
                    s = socket.create_connection(("127.0.0.1", port), timeout=5)  # a stalled I/O thread stops accepting
                    batch.append(s)
            except OSError:
                break
            finally:
                for s in batch:
                    s.close()
            cycles += len(batch)
        msg_id = kc.kernel_info()
        reply = kc.get_shell_msg(timeout=TIMEOUT)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert cycles == 1500
        r, out = execute(kc, "print('still here')")
        assert r["content"]["status"] == "ok"
        assert stdout_of(out) == "still here\n"
    finally:
        stop_kernel(km, kc)
