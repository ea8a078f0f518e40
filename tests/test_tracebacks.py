"""Errors as the user sees them (issue 9, sections 5 and 8).

Tier 3 (a real kernel, jupyter_client clients) unless marked tier 1.

Section 5, exceptions that break formatting: an exception whose ``__str__``
raises (of every base class a cell can raise), odd ``__notes__``, a
``_render_traceback_`` that fails, display formatters that raise, display
data JSON cannot carry, and the same failures in user expressions,
background tasks of ``trikernel.nursery`` and comm handlers. Each must give
exactly one ``error`` with the right ``ename``, CPython's placeholder
``<exception str() failed>`` as ``evalue``, consistent execution counts, and
a kernel that serves the next request.

Section 8, noise: no frame of trikernel, trio or outcome (nor IPython's
``run_code``) in what the user sees, the user's frames and the final line
kept. Frames are told apart by the installed packages' directories, never by
a substring such as ``"trikernel/"`` (the clone may live in a folder of that
name).
"""

from __future__ import annotations

import os
import re
import textwrap
import time
from typing import TYPE_CHECKING, Any

import outcome
import pytest
import trio
from conftest import (
    TIMEOUT,
    ValidatingClient,
    collect_outputs,
    execute,
    start_kernel,
    stdout_of,
    stop_kernel,
    wait_for_marker,
)
from IPython.utils.path import compress_user

import trikernel
from trikernel.user import tracebacks

if TYPE_CHECKING:
    from collections.abc import Iterator

    from jupyter_client.manager import KernelManager

pytestmark = pytest.mark.timeout(120)

STR_FAILED = "<exception str() failed>"
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
#: A line that introduces a frame: IPython's ("Cell In[3], line 1", "File /x.py:3, in f")
#: or the standard library's ('  File "/tmp/ipykernel_7/123.py", line 1, in <module>'), maybe inside a group's "| ".
FRAME_RE = re.compile(r"^[\s|]*(Cell In\[\d+\]|File )")
#: A frame of the user's own code: a cell (named as ipykernel names cells, user/cellnames.py).
USER_FRAME_RE = re.compile(r"^[\s|]*(Cell In\[\d+\]|File \"[^\"]*/ipykernel_\d+/\d+\.py\")")

#: Failing cells are sent without stop_on_error: these tests are about what the
#: failure looks like, and the next request must run whenever it arrives.
NO_ABORT = False

BAD = "class Bad({base}):\n    def __str__(self):\n        raise ValueError('str failed')\n"


def code(src: str) -> str:
    return textwrap.dedent(src).strip("\n") + "\n"


def plain(traceback: list[str]) -> str:
    return ANSI_RE.sub("", "\n".join(traceback))


def machinery_dirs() -> list[str]:
    """The installed trikernel, trio and outcome package folders, as paths and
    as IPython prints them (home folder as ``~``)."""
    dirs = []
    for mod in (trikernel, trio, outcome):
        d = os.path.dirname(os.path.abspath(mod.__file__ or ""))
        dirs += [d + os.sep, compress_user(d) + os.sep]
    return dirs


def frames_of(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if FRAME_RE.match(line)]


def assert_user_frames_only(text: str) -> None:
    """Every frame shown is a cell's, and no machinery folder is named."""
    for d in machinery_dirs():
        assert d not in text, f"{d} in traceback:\n{text}"
    others = [f for f in frames_of(text) if not USER_FRAME_RE.match(f)]
    assert not others, f"machinery frames {others} in traceback:\n{text}"


def reply_to(kc: ValidatingClient, msg_id: str) -> dict[str, Any]:
    """The shell reply to ``msg_id`` (skipping others, e.g. wait_for_ready's kernel_info replies)."""
    while True:
        r = kc.get_shell_msg(timeout=TIMEOUT)
        if r["parent_header"].get("msg_id") == msg_id:
            return r


def errors_in(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m["content"] for m in outputs if m["msg_type"] == "error"]


def input_count(outputs: list[dict[str, Any]]) -> int:
    (count,) = [m["content"]["execution_count"] for m in outputs if m["msg_type"] == "execute_input"]
    return int(count)


def assert_serves(kc: ValidatingClient) -> None:
    reply, out = execute(kc, "print('still serving')")
    assert reply["content"]["status"] == "ok", reply["content"]
    assert stdout_of(out) == "still serving\n"
    assert reply["content"]["execution_count"] == input_count(out)


def failing_cell(kc: ValidatingClient, src: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run a cell that must fail; check the shape every failure has; return (reply content, the one error)."""
    reply, out = execute(kc, src, stop_on_error=NO_ABORT)
    c = reply["content"]
    assert c["status"] == "error", c
    assert c["execution_count"] == input_count(out), "execute_reply and execute_input counts differ"
    errors = errors_in(out)
    assert len(errors) == 1, [(m["msg_type"], m["content"]) for m in out]
    err = errors[0]
    assert (err["ename"], err["evalue"]) == (c["ename"], c["evalue"])
    assert err["traceback"] == c["traceback"]
    assert isinstance(err["traceback"], list)
    assert all(isinstance(s, str) for s in err["traceback"])
    return c, err


# --------------------------------------------------------------------------
# section 5: exceptions whose str() raises, of every kind a cell can raise


@pytest.mark.parametrize("base", ["Exception", "BaseException", "KeyboardInterrupt", "SystemExit", "ArithmeticError"])
def test_cell_raises_exception_whose_str_raises(kernel, base):
    """issue 9 §5: ``raise Bad()`` where ``Bad.__str__`` raises."""
    _km, kc = kernel
    c, err = failing_cell(kc, BAD.format(base=base) + "raise Bad()\n")
    assert c["ename"] == "Bad", c
    assert c["evalue"] == STR_FAILED, c
    tb = plain(err["traceback"])
    assert tb.rstrip().endswith(f"Bad: {STR_FAILED}"), tb
    assert "ValueError: str failed" not in tb, "the secondary exception replaced the user's"
    assert_user_frames_only(tb)
    assert_serves(kc)


def test_group_whose_str_raises_and_bad_members(kernel):
    """An ExceptionGroup subclass with a failing str, holding a member with one."""
    _km, kc = kernel
    src = BAD.format(base="Exception") + code(
        """
        class BadGroup(ExceptionGroup):
            def __str__(self):
                raise ValueError('str failed')
        raise BadGroup("g", [Bad(), KeyError("k")])
        """
    )
    c, err = failing_cell(kc, src)
    assert c["ename"] == "BadGroup", c
    assert c["evalue"] == STR_FAILED, c
    tb = plain(err["traceback"])
    assert f"Bad: {STR_FAILED}" in tb, tb
    assert "KeyError: 'k'" in tb, tb
    assert_user_frames_only(tb)
    assert_serves(kc)


def test_trio_nursery_in_cell_with_a_bad_child(kernel):
    """A cell's trio nursery: children's errors, one with a failing str, as one group error."""
    _km, kc = kernel
    src = BAD.format(base="Exception") + code(
        """
        import trio
        async def bad_child():  # both raise before a checkpoint: neither is cancelled
            raise Bad()
        async def plain_child():
            raise RuntimeError("plain child")
        async with trio.open_nursery() as n:
            n.start_soon(bad_child)
            n.start_soon(plain_child)
        """
    )
    c, err = failing_cell(kc, src)
    assert c["ename"] == "ExceptionGroup", c
    tb = plain(err["traceback"])
    assert f"Bad: {STR_FAILED}" in tb, tb
    assert "RuntimeError: plain child" in tb, tb
    assert "raise Bad()" in tb, tb
    assert 'raise RuntimeError("plain child")' in tb, tb
    assert "async with trio.open_nursery() as n:" in tb, tb
    assert_user_frames_only(tb)
    assert_serves(kc)


@pytest.mark.parametrize(
    ("setup", "final"),
    [
        pytest.param("e.__notes__ = [1, 'two']", "ValueError: boom", id="notes-not-str"),
        pytest.param("e.__notes__ = 5", "ValueError: boom", id="notes-not-a-sequence"),
        pytest.param(
            "class N:\n    def __str__(self): raise TypeError('no')\ne.__notes__ = [N()]",
            "ValueError: boom",
            id="note-str-raises",
        ),
    ],
)
def test_odd_notes_still_format(kernel, setup, final):
    """PEP 678 notes that are not strs: IPython's formatter fails on them."""
    _km, kc = kernel
    c, err = failing_cell(kc, f"e = ValueError('boom')\n{setup}\nraise e\n")
    assert c["ename"] == "ValueError"
    assert c["evalue"] == "boom"
    assert final in plain(err["traceback"])
    assert_serves(kc)


@pytest.mark.parametrize(
    "render", ["raise ValueError('render failed')", "return None", "return [1, 2]"], ids=["raises", "none", "not-str"]
)
def test_render_traceback_that_fails(kernel, render):
    """``_render_traceback_`` (IPython's hook for custom tracebacks) that raises or returns the wrong shape."""
    _km, kc = kernel
    src = f"class T(Exception):\n    def _render_traceback_(self):\n        {render}\nraise T('custom')\n"
    c, err = failing_cell(kc, src)
    assert c["ename"] == "T"
    assert c["evalue"] == "custom"
    tb = plain(err["traceback"])
    assert "T: custom" in tb, tb
    assert "raise T('custom')" in tb, tb
    assert_user_frames_only(tb)
    assert_serves(kc)


# --------------------------------------------------------------------------
# section 5: display formatting that raises

FORMATTER_CASES = {
    "repr-in-execute-result": ("class O:\n    def __repr__(self): {raise_}\n", "O()"),
    "repr-html": ("class O:\n    def _repr_html_(self): {raise_}\n", "O()"),
    "repr-mimebundle": ("class O:\n    def _repr_mimebundle_(self, include=None, exclude=None): {raise_}\n", "O()"),
    "ipython-display": ("class O:\n    def _ipython_display_(self): {raise_}\n", "O()"),
    "display-call": ("class O:\n    def __repr__(self): {raise_}\n", "display(O())"),
    "registered-formatter": (
        "class O: pass\ndef fmt(obj): {raise_}\n"
        "get_ipython().display_formatter.formatters['text/html'].for_type(O, fmt)\n",
        "O()",
    ),
}


@pytest.mark.parametrize("exc", ["Bad()", "ValueError('plain')"])
@pytest.mark.parametrize("case", sorted(FORMATTER_CASES))
def test_display_formatter_that_raises(kernel, case, exc):
    """A repr or rich formatter that raises: one error shown, the kernel serves on.

    Formatting the cell's result (execute_result) that fails fails the
    request, with the formatter's ename and evalue (ipykernel 7 fails it
    too, but reports ``NoneType``); a failing ``display()`` does not.
    """
    _km, kc = kernel
    define, use = FORMATTER_CASES[case]
    ok_reply, _ = execute(kc, BAD.format(base="Exception") + define.format(raise_=f"raise {exc}"))
    assert ok_reply["content"]["status"] == "ok", ok_reply["content"]
    reply, out = execute(kc, use, stop_on_error=NO_ABORT)
    c = reply["content"]
    assert c["execution_count"] == input_count(out)
    errors = errors_in(out)
    assert len(errors) == 1, [(m["msg_type"], m["content"]) for m in out]
    err = errors[0]
    expected = ("Bad", STR_FAILED) if exc == "Bad()" else ("ValueError", "plain")
    assert (err["ename"], err["evalue"]) == expected
    if use.startswith("display("):
        assert c["status"] == "ok", c
    else:
        assert c["status"] == "error", c
        assert (c["ename"], c["evalue"], c["traceback"]) == (err["ename"], err["evalue"], err["traceback"])
    assert_user_frames_only(plain(err["traceback"]))
    assert_serves(kc)


@pytest.mark.parametrize(
    "src",
    [
        "class J:\n    def _repr_json_(self): return {'a': object()}\nJ()",
        "display({'application/json': {'a': object()}}, raw=True)",
        "display({'text/plain': 'x'}, metadata={'a': object()}, raw=True)",
    ],
    ids=["execute-result", "display-data", "display-metadata"],
)
def test_display_data_json_cannot_carry(kernel, src):
    """Data the wire cannot carry is the cell's TypeError, without the serialiser's frames."""
    _km, kc = kernel
    c, err = failing_cell(kc, src)
    assert c["ename"] == "TypeError", c
    assert "JSON" in c["evalue"], c
    tb = plain(err["traceback"])
    assert_user_frames_only(tb)
    assert "json" + os.sep not in tb, tb
    assert "orjson" not in tb, tb
    assert_serves(kc)


def test_user_expression_whose_error_str_raises(kernel):
    """user_expressions: an expression raising Bad is that expression's error; the cell is ok."""
    _km, kc = kernel
    execute(kc, BAD.format(base="Exception") + "def explode():\n    raise Bad()\n")
    reply, out = execute(kc, "x = 1", user_expressions={"e": "explode()", "fine": "x + 1"})
    c = reply["content"]
    assert c["status"] == "ok", c
    assert c["execution_count"] == input_count(out)
    e = c["user_expressions"]["e"]
    assert e["status"] == "error", e
    assert e["ename"] == "Bad", e
    assert e["evalue"] == STR_FAILED, e
    assert c["user_expressions"]["fine"]["data"]["text/plain"] == "2"
    assert_serves(kc)


def test_background_task_error_whose_str_raises(kernel):
    """trikernel.nursery: a task's Bad is written to the stderr of the cell that started it."""
    _km, kc = kernel
    execute(kc, BAD.format(base="Exception"))
    msg_id = kc.execute(
        code(
            """
            import trio
            async def bad_task():
                await trio.sleep(0)
                raise Bad()
            nursery.start_soon(bad_task)
            """
        )
    )
    tb = background_stderr(kc, msg_id, "Bad")
    assert tb.endswith(f"\nBad: {STR_FAILED}\n"), tb
    assert "raise Bad()" in tb
    assert_user_frames_only(tb)
    assert_serves(kc)


def background_stderr(kc: ValidatingClient, msg_id: str, ename: str) -> str:
    """The stderr text of cell ``msg_id`` once a background task's ``ename`` is in it
    (tracebacks.show_on_stderr: never an ``error`` output, which says the cell raised)."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + TIMEOUT
    while f"\n{ename}: " not in stdout_of(seen, "stderr"):
        m = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if m["parent_header"].get("msg_id") == msg_id:
            seen.append(m)
    assert errors_in(seen) == []
    text = stdout_of(seen, "stderr")
    assert text.startswith("Exception in trikernel.nursery task __main__."), text
    return text


def test_background_task_error_from_trio_shows_user_frames(kernel):
    """A background task's error raised inside trio: trio's frames are hidden, the task's line kept."""
    _km, kc = kernel
    msg_id = kc.execute(
        code(
            """
            import trio
            async def sleeper():
                await trio.sleep(-1)
            nursery.start_soon(sleeper)
            """
        )
    )
    tb = background_stderr(kc, msg_id, "ValueError")
    assert "await trio.sleep(-1)" in tb, tb
    assert_user_frames_only(tb)


# --------------------------------------------------------------------------
# section 5: comm handlers

COMM_SETUP = BAD.format(base="Exception") + code(
    """
    import comm
    class B(BaseException): pass
    class K(KeyboardInterrupt): pass
    def on_open(c, msg):
        if msg["content"]["data"].get("exc"):
            raise eval(msg["content"]["data"]["exc"])
        @c.on_msg
        def _(m):
            raise eval(m["content"]["data"]["exc"])
    comm.get_comm_manager().register_target("trikernel.test.raises", on_open)
    """
)


@pytest.fixture(scope="module")
def comm_kernel(jupyter_path: str) -> Iterator[tuple[KernelManager, ValidatingClient]]:
    km, kc = start_kernel("trikernel-test-signal")
    reply, _ = execute(kc, COMM_SETUP)
    assert reply["content"]["status"] == "ok", reply["content"]
    yield km, kc
    stop_kernel(km, kc)


def send_comm(kc: ValidatingClient, msg_type: str, content: dict[str, Any]) -> list[dict[str, Any]]:
    msg = kc.session.msg(msg_type, content)
    kc.shell_channel.send(msg)
    return collect_outputs(kc, msg["header"]["msg_id"])


@pytest.mark.parametrize(
    ("exc", "ename", "evalue"),
    [
        ("Bad()", "Bad", STR_FAILED),
        ("ValueError('v')", "ValueError", "v"),
        ("SystemExit(3)", "SystemExit", "3"),
        ("B('b')", "B", "b"),
        ("K('k')", "K", "k"),
    ],
)
def test_comm_msg_handler_error_is_shown(comm_kernel, exc, ename, evalue):
    """An on_msg handler's error, of any base class, is an error output parented to the comm_msg."""
    _km, kc = comm_kernel
    comm_id = f"c-{ename}"
    opened = send_comm(kc, "comm_open", {"comm_id": comm_id, "target_name": "trikernel.test.raises", "data": {}})
    assert not errors_in(opened)
    out = send_comm(kc, "comm_msg", {"comm_id": comm_id, "data": {"exc": exc}})
    errors = errors_in(out)
    assert len(errors) == 1, [(m["msg_type"], m["content"]) for m in out]
    assert (errors[0]["ename"], errors[0]["evalue"]) == (ename, evalue)
    assert_user_frames_only(plain(errors[0]["traceback"]))
    assert_serves(kc)


@pytest.mark.parametrize(("exc", "ename"), [("SystemExit(4)", "SystemExit"), ("B('b')", "B")])
def test_comm_open_target_base_exception_is_shown(comm_kernel, exc, ename):
    """A comm target raising a BaseException: shown, and the io run is not taken down."""
    _km, kc = comm_kernel
    out = send_comm(
        kc, "comm_open", {"comm_id": f"o-{ename}", "target_name": "trikernel.test.raises", "data": {"exc": exc}}
    )
    errors = errors_in(out)
    assert len(errors) == 1, [(m["msg_type"], m["content"]) for m in out]
    assert errors[0]["ename"] == ename, [(m["msg_type"], m["content"]) for m in out]
    assert_serves(kc)


# --------------------------------------------------------------------------
# section 8: noise in tracebacks


@pytest.mark.parametrize("mode", ["signal", "message"])
def test_interrupted_trio_sleep_shows_only_the_cell(jupyter_path, mode):
    """issue 9 §8: interrupting ``await trio.sleep(30)``: the cell's frame and the final line, nothing of trio."""
    km, kc = start_kernel(f"trikernel-test-{mode}")
    try:
        msg_id = kc.execute("import trio\nprint('STARTED')\nawait trio.sleep(30)\n")
        wait_for_marker(kc, msg_id)
        km.interrupt_kernel()
        out = collect_outputs(kc, msg_id)
        c = reply_to(kc, msg_id)["content"]
        assert c["status"] == "error", c
        assert c["ename"] == "KeyboardInterrupt", c
        (err,) = errors_in(out)
        tb = plain(err["traceback"])
        assert "----> 3 await trio.sleep(30)" in tb, tb
        assert tb.rstrip().endswith("KeyboardInterrupt:"), tb
        assert frames_of(tb) == ["Cell In[1], line 3"], tb
        assert_user_frames_only(tb)
        assert_serves(kc)
    finally:
        stop_kernel(km, kc)


def test_interrupted_cell_nursery_shows_only_user_frames(jupyter_path):
    """Interrupting a cell parked in its own nursery: a group of KeyboardInterrupts, user frames only."""
    km, kc = start_kernel("trikernel-test-signal")
    try:
        msg_id = kc.execute(
            code(
                """
                import trio
                async with trio.open_nursery() as n:
                    n.start_soon(trio.sleep, 30)
                    print('STARTED')
                    await trio.sleep(30)
                """
            )
        )
        wait_for_marker(kc, msg_id)
        km.interrupt_kernel()
        out = collect_outputs(kc, msg_id)
        (err,) = errors_in(out)
        tb = plain(err["traceback"])
        assert "KeyboardInterrupt" in tb
        assert "async with trio.open_nursery() as n:" in tb, tb
        assert_user_frames_only(tb)
    finally:
        stop_kernel(km, kc)


def test_error_raised_inside_trio_shows_the_cell_line(kernel):
    """``await trio.sleep(-1)``: trio's ValueError with the cell's line, not trio's internals."""
    _km, kc = kernel
    c, err = failing_cell(kc, "import trio\nawait trio.sleep(-1)\n")
    assert c["ename"] == "ValueError"
    tb = plain(err["traceback"])
    assert "----> 2 await trio.sleep(-1)" in tb, tb
    assert frames_of(tb) == ["Cell In[{}], line 2".format(c["execution_count"])], tb
    assert tb.rstrip().endswith("ValueError: `seconds` must be non-negative"), tb


def test_nursery_child_error_group_has_no_run_code_frame(kernel):
    """The group rendering (standard library) leaves out IPython's run_code and trio's frames too."""
    _km, kc = kernel
    _c, err = failing_cell(
        kc,
        code(
            """
            import trio
            async def child():
                raise ValueError("child failed")
            async with trio.open_nursery() as n:
                n.start_soon(child)
            """
        ),
    )
    tb = plain(err["traceback"])
    assert "run_code" not in tb, tb
    assert "ValueError: child failed" in tb, tb
    assert_user_frames_only(tb)
    assert len(frames_of(tb)) == 2, tb  # the cell's ``async with`` line, child's raise


def test_xmode_show_reveals_hidden_frames(jupyter_path):
    """``%xmode --show`` shows machinery frames (IPython's switch for hidden frames); ``--hide`` hides them."""
    km, kc = start_kernel("trikernel-test-signal")
    try:
        execute(kc, "%xmode --show")
        _c, err = failing_cell(kc, "import trio\nawait trio.sleep(-1)\n")
        assert len(frames_of(plain(err["traceback"]))) > 1, plain(err["traceback"])
        execute(kc, "%xmode --hide")
        _c, err = failing_cell(kc, "await trio.sleep(-1)\n")
        assert_user_frames_only(plain(err["traceback"]))
    finally:
        stop_kernel(km, kc)


# --------------------------------------------------------------------------
# tier 1: the frame filter and safe strings


def test_frame_filter_uses_package_folders_not_names(tmp_path):
    """A file in a folder *named* trikernel (a clone) is not machinery; the installed packages are."""
    f = tracebacks.FrameFilter(["trikernel", "trio", "outcome"])
    assert f.hidden(trio.__file__)
    assert f.hidden(outcome.__file__)
    assert f.hidden(tracebacks.__file__)
    clone = tmp_path / "trikernel" / "examples"
    clone.mkdir(parents=True)
    assert not f.hidden(str(clone / "notebook_helper.py"))
    assert not f.hidden(str(tmp_path / "trio" / "mine.py"))
    assert not f.hidden("<ipython-input-1-abc>")
    assert not f.hidden(None)


def test_safe_str_and_notes():
    class Bad(Exception):
        def __str__(self) -> str:
            raise ValueError

    class NotStr(Exception):
        def __str__(self) -> str:
            return 42  # type: ignore[return-value]

    assert tracebacks.safe_str(Bad()) == STR_FAILED
    assert tracebacks.safe_str(NotStr()) == STR_FAILED
    assert tracebacks.safe_str(ValueError("v")) == "v"
    e = ValueError()
    e.__notes__ = [1, "two", Bad()]  # type: ignore[list-item]
    assert tracebacks.safe_notes(e) == ["1", "two", "<note str() failed>"]
    e.__notes__ = 5  # type: ignore[assignment]
    assert tracebacks.safe_notes(e) == ["5"]
