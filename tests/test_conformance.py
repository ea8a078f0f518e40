"""The conformance suite (trikernel.conformance) and its validator (trikernel.msgspec).

- Tier 1: msgspec on hand-made messages: every protocol 5.5 type has a valid
  sample that passes, each correction and rule is shown to catch its
  departure, and no input of any shape makes it raise.
- Tier 3: the suite against tests/faulty_kernel.py. Without faults every
  check passes (no false alarms); with each fault the checks that fault
  breaks FAIL (each check can fail). A hanging kernel ends in FAILs, never
  a hung run; a kernel that does not start ends in FAILs and exit status 1.
- Tier 4: the suite against trikernel (every check must pass), ipykernel and
  xeus-python (a verdict on every check and at least one real departure).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from conftest import env_set
from hypothesis import given, settings
from hypothesis import strategies as st
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

from trikernel.conformance import Report, cli, run
from trikernel.conformance.catalogue import catalogue
from trikernel.protocol import msgspec

HERE = os.path.dirname(os.path.abspath(__file__))
FAULTY = os.path.join(HERE, "faulty_kernel.py")
sys.path.insert(0, HERE)
from faulty_kernel import FAULTS  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Iterator

# ---------------------------------------------------------------- tier 1: msgspec


def _header(msg_type: str) -> dict[str, Any]:
    return {
        "msg_id": "a1",
        "msg_type": msg_type,
        "username": "u",
        "session": "s1",
        "date": datetime.now(UTC).isoformat(),
        "version": "5.5",
    }


def _msg(msg_type: str, content: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"header": _header(msg_type), "parent_header": {}, "metadata": {}, "content": content, **kw}


ERROR = {"status": "error", "ename": "E", "evalue": "v", "traceback": ["t"]}
VALID: dict[str, dict[str, Any]] = {
    "execute_request": {
        "code": "1",
        "silent": False,
        "store_history": True,
        "user_expressions": {},
        "allow_stdin": True,
        "stop_on_error": True,
    },
    "execute_reply": {"status": "ok", "execution_count": 1, "user_expressions": {}, "payload": []},
    "inspect_request": {"code": "x", "cursor_pos": 1, "detail_level": 0},
    "inspect_reply": {"status": "ok", "found": True, "data": {"text/plain": "x"}, "metadata": {}},
    "complete_request": {"code": "x", "cursor_pos": 1},
    "complete_reply": {"status": "ok", "matches": ["xy"], "cursor_start": 0, "cursor_end": 1, "metadata": {}},
    "history_request": {"output": True, "raw": True, "hist_access_type": "tail", "n": 2},
    "history_reply": {"status": "ok", "history": [[1, 1, "a"], [1, 2, ["b", None]]]},
    "is_complete_request": {"code": "for i in x:"},
    "is_complete_reply": {"status": "incomplete", "indent": "    "},
    "connect_request": {},
    "connect_reply": {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "hb_port": 4, "control_port": 5},
    "comm_info_request": {"target_name": "t"},
    "comm_info_reply": {"status": "ok", "comms": {"c": {"target_name": "t"}}},
    "kernel_info_request": {},
    "kernel_info_reply": {
        "status": "ok",
        "protocol_version": "5.5",
        "implementation": "i",
        "implementation_version": "1",
        "language_info": {"name": "python", "version": "3", "mimetype": "text/x-python", "file_extension": ".py"},
        "banner": "",
        "supported_features": ["debugger"],
        "help_links": [{"text": "t", "url": "u"}],
    },
    "shutdown_request": {"restart": False},
    "shutdown_reply": {"status": "ok", "restart": False},
    "interrupt_request": {},
    "interrupt_reply": {"status": "ok"},
    "debug_request": {"type": "request", "seq": 1, "command": "debugInfo", "arguments": {}},
    "debug_reply": {
        "type": "response",
        "seq": 2,
        "request_seq": 1,
        "success": True,
        "command": "debugInfo",
        "body": {},
    },
    "create_subshell_request": {},
    "create_subshell_reply": {"status": "ok", "subshell_id": "s"},
    "delete_subshell_request": {"subshell_id": "s"},
    "delete_subshell_reply": {"status": "ok"},
    "list_subshell_request": {},
    "list_subshell_reply": {"status": "ok", "subshell_id": ["s"]},
    "iopub_welcome": {"subscription": ""},
    "stream": {"name": "stdout", "text": "x"},
    "display_data": {"data": {"text/plain": "x"}, "metadata": {}, "transient": {"display_id": "d"}},
    "update_display_data": {"data": {"text/plain": "x"}, "metadata": {}, "transient": {"display_id": "d"}},
    "execute_input": {"code": "1", "execution_count": 1},
    "execute_result": {"execution_count": 1, "data": {"text/plain": "1"}, "metadata": {}},
    "error": {"ename": "E", "evalue": "v", "traceback": []},
    "status": {"execution_state": "busy"},
    "clear_output": {"wait": False},
    "debug_event": {"type": "event", "seq": 3, "event": "stopped", "body": {}},
    "input_request": {"prompt": "> ", "password": False},
    "input_reply": {"value": "x"},
    "comm_open": {"comm_id": "c", "target_name": "t", "data": {}},
    "comm_msg": {"comm_id": "c", "data": {"x": 1}},
    "comm_close": {"comm_id": "c", "data": {}},
}


def test_every_protocol_type_has_a_valid_sample() -> None:
    assert set(VALID) == set(msgspec.KNOWN_MSG_TYPES)


@pytest.mark.parametrize("msg_type", sorted(VALID))
def test_valid_message_has_no_violation(msg_type: str) -> None:
    channel = sorted(msgspec.CHANNELS[msg_type])[0]
    found = msgspec.validate_message(_msg(msg_type, VALID[msg_type]), channel=channel)  # type: ignore[arg-type]
    if msg_type.startswith("connect_"):  # valid, but deprecated since 5.1
        assert [v.deprecated for v in found] == [True]
    else:
        assert found == [], msg_type


@pytest.mark.parametrize(
    ("msg_type", "content", "field", "expected"),
    [
        # the corrections of msgspec_v5
        ("input_request", {"prompt": "", "password": 1}, "content.password", "a boolean"),
        ("execute_reply", {"status": "ok", "execution_count": 1.5}, "content.execution_count", "an integer"),
        ("complete_request", {"code": "x", "cursor_pos": 1.0}, "content.cursor_pos", "an integer"),
        # execution_count on ok, an integer if an error reply has one; aborted is deprecated
        (
            "execute_reply",
            {"status": "ok", "user_expressions": {}, "payload": []},
            "content.execution_count",
            "present",
        ),
        ("execute_reply", {**ERROR, "execution_count": "2"}, "content.execution_count", "an integer, when present"),
        ("shutdown_reply", {"status": "aborted"}, "content.status", "'error' (kernels should not send 'aborted')"),
        ("inspect_reply", {"status": "fine"}, "content.status", "one of 'ok', 'error'"),
        # rules beyond a schema
        ("is_complete_reply", {"status": "incomplete"}, "content.indent", "a string when status is 'incomplete'"),
        (
            "update_display_data",
            {"data": {}, "metadata": {}, "transient": {}},
            "content.transient.display_id",
            "a string",
        ),
        (
            "history_reply",
            {"status": "ok", "history": [[1, "2", "x"]]},
            "content.history.0",
            "(session: int, line: int, input: str or (input, output))",
        ),
        (
            "complete_reply",
            {"status": "ok", "matches": [], "cursor_start": 3, "cursor_end": 1, "metadata": {}},
            "content.cursor_start",
            "<= cursor_end (1)",
        ),
        # the gaps msgspec_v5 leaves
        ("comm_open", {"comm_id": "c", "data": {}}, "content.target_name", "present"),
        ("comm_msg", {"comm_id": "c", "data": []}, "content.data", "an object"),
        ("iopub_welcome", {"subscription": None}, "content.subscription", "a string"),
        (
            "kernel_info_reply",
            {**VALID["kernel_info_reply"], "language_info": {"name": "p"}},
            "content.language_info.version",
            "present",
        ),
        ("debug_reply", {"type": "request", "success": True, "command": "x"}, "content.type", "one of 'response'"),
        ("display_data", {"data": {"plain": "x"}, "metadata": {}}, "content.data", "MIME types as keys (type/subtype)"),
    ],
)
def test_content_violation_names_field_expectation_and_section(
    msg_type: str, content: dict[str, Any], field: str, expected: str
) -> None:
    found = {v.field: v for v in msgspec.validate_content(msg_type, content)}
    assert field in found, [str(v) for v in found.values()]
    v = found[field]
    assert v.expected == expected
    assert v.section.startswith("messaging § ")
    assert field in str(v)
    assert v.section in str(v)


def test_an_error_execute_reply_may_leave_out_the_count() -> None:
    """A request that never ran (aborted by stop_on_error) has no count to
    give: JupyterLab puts a reply's count on the cell's prompt, so with one
    the skipped cells of a Run All showed a number (spec: the error reply
    omits the usual content of a successful reply)."""
    assert msgspec.validate_content("execute_reply", dict(ERROR)) == []
    assert msgspec.validate_content("execute_reply", {**ERROR, "execution_count": 3}) == []


def test_aborted_is_reported_as_deprecated() -> None:
    (v,) = msgspec.validate_content("interrupt_reply", {"status": "aborted"})
    assert v.deprecated
    assert "deprecated" in str(v)


def test_error_reply_of_is_complete_is_an_error_reply() -> None:
    assert msgspec.validate_content("is_complete_reply", dict(ERROR)) == []
    assert [v.field for v in msgspec.validate_content("is_complete_reply", {"status": "error"})] == [
        "content.ename",
        "content.evalue",
        "content.traceback",
    ]


@pytest.mark.parametrize(
    ("header_update", "field"),
    [
        ({"date": "2024-13-01T00:00:00Z"}, "header.date"),
        ({"date": "yesterday"}, "header.date"),
        ({"date": "2024-01-01"}, "header.date"),
        ({"version": "6.0"}, "header.version"),
        ({"version": "5"}, "header.version"),
        ({"msg_id": ""}, "header.msg_id"),
        ({"session": 3}, "header.session"),
        ({"subshell_id": 1}, "header.subshell_id"),
    ],
)
def test_header_violations(header_update: dict[str, Any], field: str) -> None:
    m = _msg("status", VALID["status"])
    m["header"].update(header_update)
    assert field in [v.field for v in msgspec.validate_message(m)]


def test_header_dates_in_every_iso_form_and_as_datetime() -> None:
    for date in (
        "2024-01-01T10:00:00Z",
        "2024-01-01T10:00:00.123456789+01:00",
        "2024-01-01T10:00:00+0100",
        "2024-01-01T10:00",
    ):
        assert msgspec.is_iso8601(date), date
    m = _msg("status", VALID["status"])
    m["header"]["date"] = datetime.now(UTC)
    assert msgspec.validate_message(m) == []


def test_missing_header_fields_and_bad_parts() -> None:
    m = _msg("status", VALID["status"], buffers=["not bytes"])
    del m["header"]["date"], m["header"]["username"]
    m["metadata"] = None
    m["parent_header"] = {"msg_id": 1}
    fields = [v.field for v in msgspec.validate_message(m)]
    assert {
        "header.date",
        "header.username",
        "metadata",
        "buffers",
        "parent_header.msg_id",
        "parent_header.session",
    } <= set(fields)


def test_channel_and_sender() -> None:
    assert [
        v.field for v in msgspec.validate_message(_msg("input_request", VALID["input_request"]), channel="shell")
    ] == ["header.msg_type"]
    assert (
        msgspec.validate_message(_msg("execute_reply", VALID["execute_reply"]), sender="client")[0].field
        == "header.msg_type"
    )
    (v,) = msgspec.validate_message(_msg("shutdown_request", {"restart": True}), channel="shell")
    assert v.deprecated


def test_unknown_types_and_extra_fields_are_allowed() -> None:
    assert msgspec.validate_message(_msg("my_custom_request", {"anything": 1}), channel="shell") == []
    assert msgspec.validate_content("stream", {"name": "stdout", "text": "x", "extra": 1}) == []


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    msg_type=st.sampled_from(sorted(VALID)),
    content=_json,
    header=st.dictionaries(
        st.sampled_from(["msg_id", "msg_type", "date", "version", "session", "username", "subshell_id"]), _json
    ),
)
def test_validator_never_raises(msg_type: str, content: Any, header: dict[str, Any]) -> None:
    m = {"header": {"msg_type": msg_type, **header}, "parent_header": content, "metadata": {}, "content": content}
    for v in msgspec.validate_message(m, channel="shell", sender="kernel"):
        assert isinstance(str(v), str)
    msgspec.validate_content(msg_type, content)


# ---------------------------------------------------------------- tier 3: the faulty kernel

#: fault -> the checks that must FAIL with it (and PASS without it).
FAULT_CHECKS: dict[str, list[str]] = {
    "wrong-parent": ["messages.parent"],
    "no-idle": ["status.busy_idle"],
    "no-busy": ["status.busy_idle"],
    "reply-after-idle": ["status.reply_before_idle"],
    "no-welcome": ["iopub.welcome", "iopub.two_subscribers"],
    "welcome-first-only": ["iopub.two_subscribers", "iopub.late_joiner"],
    "duplicate-msg-id": ["messages.msg_id"],
    "bad-date": ["messages.date"],
    "bad-version": ["messages.version"],
    "no-username": ["messages.header"],
    "input-after-output": ["execute.input_first"],
    "bad-signature": ["messages.signature"],
    "accept-bad-signature": ["bad_input.signature"],
    "accept-replay": ["bad_input.replay"],
    "crash-on-malformed": ["bad_input.malformed"],
    "silent-unknown": ["bad_input.unknown_shell", "bad_input.unknown_control"],
    "ok-unknown": ["bad_input.unknown_shell", "bad_input.unknown_control"],
    "password-int": ["stdin.password", "messages.content"],
    "stdin-when-not-allowed": ["stdin.not_allowed"],
    "count-unstored": ["execute.store_history_false"],
    "loud-silent": ["execute.silent"],
    "abort-everything": ["stop_on_error.only_execute"],
    "no-abort": ["stop_on_error.run_all"],
    "utf16-cursor": ["complete.non_bmp"],
    "no-comm-close": ["comm.unknown_target"],
    "hb-blocked": ["heartbeat.busy"],
    "ignore-interrupt": ["interrupt.sleep", "interrupt.busy_loop", "interrupt.input"],
    "no-exit": ["lifecycle.exit"],
    "lossy-flood": ["iopub.flood"],
    "no-execution-count": ["messages.content"],
    "ename-repr": ["execute.error"],
    "fixed-session": ["lifecycle.restart"],
    "restart-false": ["lifecycle.restart"],
    "hang-execute": ["execute.stream"],  # test_a_hanging_kernel_gives_fails_not_a_hung_run
    "no-stdin-parent": ["stdin.input"],
    "lossy-pub": ["iopub.slow_subscriber"],
    "handshake-j-only": ["startup.handshake_p"],
    "debug-failure": ["debug.info"],
    "handshake-p-only": ["startup.handshake_j"],
    "hb-wrong-port": ["startup.ports", "heartbeat.echo"],
    "hb-garbled": ["heartbeat.echo", "heartbeat.busy"],
    "reply-on-stdin": ["bad_input.stdin"],
    "no-control-kernel-info": ["kernel_info.control"],
    "kernel-info-incomplete": ["kernel_info.shell"],
    "stdout-as-stderr": ["execute.stream"],
    "result-count-off": ["execute.result"],
    "counter-stuck": ["execute.counter"],
    "no-user-expressions": ["execute.user_expressions"],
    "display-id-mismatch": ["execute.display"],
    "always-complete": ["is_complete"],
    "no-matches": ["complete", "complete.non_bmp"],
    "always-found": ["inspect"],
    "no-history": ["history.tail", "history.range", "history.search"],
    "comms-as-list": ["comm_info"],
    "comm-no-dispatch": ["comm.lifecycle"],
    "abort-despite-false": ["stop_on_error.false"],
    "aborted-count": ["stop_on_error.run_all"],
    "no-shutdown-reply": ["lifecycle.shutdown"],
}
#: Faults that need a kernelspec declaring JEP 66.
HANDSHAKE_FAULTS = {"handshake-j-only", "handshake-p-only"}
#: Deadlines shrink for faults that make the suite wait them out.
SCALE = 0.3


def _spec(root: str, name: str, faults: list[str], *, protocol: str = "5.5") -> None:
    d = os.path.join(root, "kernels", name)
    os.makedirs(d, exist_ok=True)
    argv = [sys.executable, FAULTY, "-f", "{connection_file}"]
    for f in faults:
        argv += ["--fault", f]
    spec = {
        "argv": argv,
        "display_name": name,
        "language": "python",
        "interrupt_mode": "signal",
        "kernel_protocol_version": protocol,
    }
    with open(os.path.join(d, "kernel.json"), "w") as f:
        json.dump(spec, f)


def _name(fault: str) -> str:
    return f"conformance-faulty-{fault}"


@pytest.fixture(scope="module")
def faulty_specs(jupyter_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A JUPYTER_PATH entry with the faulty kernel, clean and with each fault
    (after conftest's session entry, so that each restores what it found)."""
    root = str(tmp_path_factory.mktemp("conformance-jupyter"))
    _spec(root, "conformance-faulty", [])
    _spec(root, "conformance-faulty-hs", [], protocol="5.6")
    _spec(root, "conformance-faulty-nostart", ["no-such-fault"])
    for fault in FAULT_CHECKS:
        _spec(root, _name(fault), [fault], protocol="5.6" if fault in HANDSHAKE_FAULTS else "5.5")
    with env_set("JUPYTER_PATH", root, prepend_path=True):
        yield root


def _rows(report: Report) -> dict[str, str]:
    return {r.name: r.status for r in report.rows}


def _table(report: Report, status: str | None = None) -> str:
    return "\n".join(f"{r.status} {r.name}: {r.figure}" for r in report.rows if status in (None, r.status))


def test_every_check_has_a_fault_that_fails_it() -> None:
    """The fault table covers every fault of the faulty kernel and every
    check of the catalogue: each check is shown to fail when it should."""
    assert set(FAULT_CHECKS) == set(FAULTS)
    names = {c.name for c in catalogue()}
    assert {c for checks in FAULT_CHECKS.values() for c in checks} == names


@pytest.fixture(scope="module")
def clean_report(faulty_specs: str) -> Report:
    return run("conformance-faulty")


@pytest.mark.timeout(300)
def test_clean_faulty_kernel_passes_every_check(clean_report: Report) -> None:
    """No false alarms: a correct kernel gets no FAIL (only the handshake checks skip)."""
    assert not clean_report.failed, _table(clean_report, "FAIL")
    skipped = {r.name for r in clean_report.rows if r.status == "SKIP"}
    assert skipped == {"startup.handshake_j", "startup.handshake_p"}, _table(clean_report, "SKIP")
    assert len(clean_report.rows) == len(catalogue())


@pytest.mark.timeout(120)
def test_clean_faulty_kernel_passes_the_handshake_checks(faulty_specs: str) -> None:
    report = run("conformance-faulty-hs", ["startup", "kernel_info.shell"])
    assert _rows(report) == {
        "startup.ports": "SKIP",
        "startup.handshake_j": "PASS",
        "startup.handshake_p": "PASS",
        "kernel_info.shell": "PASS",
    }, _table(report)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", sorted(set(FAULT_CHECKS) - {"hang-execute"}))
def test_each_fault_fails_its_checks(faulty_specs: str, clean_report: Report, fault: str) -> None:
    checks = FAULT_CHECKS[fault]
    clean = _rows(clean_report)
    if fault in HANDSHAKE_FAULTS:
        clean = _rows(run("conformance-faulty-hs", checks))
    assert all(clean[c] == "PASS" for c in checks), f"{fault}: not all of {checks} pass without the fault"
    report = run(_name(fault), checks, timeout_scale=SCALE)
    got = _rows(report)
    assert all(got[c] == "FAIL" for c in checks), f"{fault} ({FAULTS[fault]}):\n{_table(report)}"
    assert all(r.figure for r in report.rows)


@pytest.mark.timeout(120)
def test_a_hanging_kernel_gives_fails_not_a_hung_run(faulty_specs: str) -> None:
    """hang-execute never answers an execute: every check that runs code
    FAILs with the deadline as its figure, the run ends, later checks run."""
    report = run(_name("hang-execute"), ["execute.stream", "kernel_info.shell"], timeout_scale=0.2)
    rows = {r.name: r for r in report.rows}
    assert rows["execute.stream"].status == "FAIL"
    assert "no reply" in rows["execute.stream"].figure
    assert "within 2 s" in rows["execute.stream"].figure
    assert "restarted" in rows["execute.stream"].figure  # the runner got an answering kernel back
    assert rows["kernel_info.shell"].status == "PASS"


# ---------------------------------------------------------------- the command line


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trikernel.conformance", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ.copy(),
    )


def test_cli_list_names_every_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    for c in catalogue():
        assert c.name in out
        assert c.section in out


@pytest.mark.timeout(120)
def test_cli_json_and_exit_status(faulty_specs: str) -> None:
    """``python -m trikernel.conformance``: --json, exit 0 on a pass, 1 on a fail."""
    ok = _cli("--json", "--check", "kernel_info.shell", "--check", "execute.input_first", "conformance-faulty")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["counts"] == {"PASS": 2, "FAIL": 0, "SKIP": 0}
    assert [r["name"] for r in doc["rows"]] == ["kernel_info.shell", "execute.input_first"]
    assert all(r["section"] and r["figure"] for r in doc["rows"])
    bad = _cli("--check", "execute.input_first", _name("input-after-output"))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "FAIL  execute.input_first" in bad.stdout
    assert "1 FAIL" in bad.stdout


@pytest.mark.timeout(120)
def test_cli_kernel_that_does_not_start(faulty_specs: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--timeout-scale", "0.2", "--check", "kernel_info", "conformance-faulty-nostart"]) == 1
    out = capsys.readouterr().out
    assert out.count("FAIL") >= 2, out
    assert "exited during start-up with code 2" in out, out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no-such-kernelspec-xyz"], "no kernelspec named 'no-such-kernelspec-xyz'"),
        (["--check", "no.such.check", "python3"], "matches no check"),
        ([], "KERNELSPEC name is required"),
        (["--timeout-scale", "0", "python3"], "--timeout-scale must be positive"),
    ],
)
def test_cli_usage_errors_are_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_console_script_is_installed() -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "trikernel-conformance")
    r = subprocess.run([exe, "--list"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "messages.parent" in r.stdout


# ---------------------------------------------------------------- tier 4: real kernels


def _installed(name: str) -> bool:
    try:
        KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        return False
    return True


@pytest.mark.timeout(600)
def test_trikernel_passes_every_check() -> None:
    if not _installed("trikernel"):
        pytest.skip("the trikernel kernelspec is not installed (pip install .)")
    report = run("trikernel")
    assert len(report.rows) == len(catalogue())
    assert not report.failed, "trikernel departs from the spec:\n" + _table(report, "FAIL")


@pytest.mark.timeout(300)
def test_interrupts_in_message_mode(jupyter_path: str) -> None:
    """interrupt_mode 'message': the suite interrupts with its own
    interrupt_request on control and checks the interrupt_reply too."""
    report = run("trikernel-test-message", ["interrupt"])
    assert not report.failed, _table(report)
    for row in report.rows:
        assert "(message mode); interrupt_reply ok" in row.figure, row.figure


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kernel", ["python3", "xpython"])
def test_other_kernels_get_a_verdict_and_a_departure(kernel: str) -> None:
    """ipykernel and xeus-python: every check reaches a verdict and the suite
    finds at least one real departure (docs/conformance.md explains each)."""
    if not _installed(kernel):
        pytest.skip(f"kernelspec {kernel} is not installed")
    report = run(kernel)
    assert len(report.rows) == len(catalogue())
    assert all(r.status in ("PASS", "FAIL", "SKIP") and r.figure for r in report.rows)
    assert report.counts()["PASS"] > len(report.rows) // 2, _table(report)
    assert report.failed, _table(report)
