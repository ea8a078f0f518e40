"""Pure validation of Jupyter messages against the messaging spec, protocol 5.5.

:func:`validate_message` takes one message as a dict (``header``,
``parent_header``, ``metadata``, ``content``, optional ``buffers``) and
returns a list of :class:`Violation`: each names the field (``header.date``,
``content.password``), what the spec expects, what was there, and the spec
section. An empty list means the message conforms. Nothing is raised for
bad input: any value, of any type, gives violations, never an exception.

What is checked:

- the envelope: the four dicts are dicts, ``buffers`` a list of bytes;
- the header (and a non-empty ``parent_header``, which is a copy of a
  header): ``msg_id``, ``msg_type``, ``session``, ``username`` strings,
  ``date`` an ISO 8601 timestamp (a ``datetime`` is accepted, as
  jupyter_client's Session hands them out parsed), ``version`` a ``5.x``
  protocol version, ``subshell_id`` a string or null;
- the content of every request, reply and IOPub type of protocol 5.5. The
  schemas are jupyter_kernel_test's ``msgspec_v5`` fragments where they fit,
  corrected where the spec says otherwise (integers where it says ``int``,
  ``input_request.password`` a boolean, request fields with defaults
  optional) and completed where it has none: comm messages, ``iopub_welcome``
  (JEP 65), subshell messages (JEP 91), ``kernel_info_reply``'s
  ``language_info`` and ``supported_features``, and debug messages (checked
  loosely: the DAP envelope, never the body);
- reply statuses (spec "Request-Reply"): ``ok`` with the full content,
  ``error`` with ``ename``/``evalue``/``traceback``, ``aborted`` reported as
  deprecated (``Violation.deprecated``) since 5.1; ``execute_reply`` carries
  an integer ``execution_count`` when ``ok``, and when ``error`` it may
  leave it out (a request that never ran, such as one aborted by
  ``stop_on_error``, has no count; see :func:`_reply_status`);
- rules a schema cannot say: ``is_complete_reply.indent`` when incomplete,
  ``update_display_data.transient.display_id``, the shape of history entries,
  ``cursor_start <= cursor_end``;
- with ``channel``: the type belongs on that channel; with ``sender``: the
  type is one that side may send.

Unknown message types and extra fields are not violations: the spec says
both sides should allow them ("Compatibility").

Pure: no sockets, no trio, no I/O; jsonschema validators are built once per
message type and cached. Safe to call from any thread.

Spec: jupyter_client docs/messaging.rst (sections named in each Violation);
JEP 65 (iopub_welcome), JEP 91 (subshells), the Debug Adapter Protocol.

Runs on: any thread (pure: no sockets, no trio, no I/O; the validators
are built once per message type and shared).
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from jsonschema import Draft4Validator
from jupyter_kernel_test.msgspec_v5 import schema_fragments as _JKT_FRAGMENTS

#: The protocol version this module validates against.
PROTOCOL_VERSION = "5.5"
#: Where the section names point.
SPEC = "messaging"

Channel = Literal["shell", "control", "iopub", "stdin"]
Sender = Literal["client", "kernel"]


@dataclass(frozen=True)
class Violation:
    """One departure of a message from the spec.

    ``field``: dotted path (``header.date``, ``content.matches.2``);
    ``expected``: what the spec asks for, in words; ``got``: a short repr of
    what was there (``"missing"`` when absent); ``section``: the spec section,
    e.g. ``"messaging § Message Header"``; ``deprecated``: the form is still
    defined but deprecated (e.g. reply status ``aborted`` since 5.1).
    """

    field: str
    expected: str
    got: str
    section: str
    deprecated: bool = False

    def __str__(self) -> str:
        tag = " (deprecated)" if self.deprecated else ""
        return f"{self.field}: expected {self.expected}, got {self.got}{tag} [{self.section}]"


def _sec(name: str) -> str:
    return f"{SPEC} § {name}"


SEC_HEADER = _sec("Message Header")
SEC_PARENT = _sec("Parent header")
SEC_FORMAT = _sec("General Message Format")
SEC_REQUEST_REPLY = _sec("Request-Reply")

#: Spec section of each message type.
SECTIONS: dict[str, str] = {
    "execute_request": _sec("Execute"),
    "execute_reply": _sec("Execution results"),
    "inspect_request": _sec("Introspection"),
    "inspect_reply": _sec("Introspection"),
    "complete_request": _sec("Completion"),
    "complete_reply": _sec("Completion"),
    "history_request": _sec("History"),
    "history_reply": _sec("History"),
    "is_complete_request": _sec("Code completeness"),
    "is_complete_reply": _sec("Code completeness"),
    "connect_request": _sec("Connect"),
    "connect_reply": _sec("Connect"),
    "comm_info_request": _sec("Comm info"),
    "comm_info_reply": _sec("Comm info"),
    "kernel_info_request": _sec("Kernel info"),
    "kernel_info_reply": _sec("Kernel info"),
    "shutdown_request": _sec("Kernel shutdown"),
    "shutdown_reply": _sec("Kernel shutdown"),
    "interrupt_request": _sec("Kernel interrupt"),
    "interrupt_reply": _sec("Kernel interrupt"),
    "debug_request": _sec("Debug request"),
    "debug_reply": _sec("Debug request"),
    "create_subshell_request": _sec("Create subshell"),
    "create_subshell_reply": _sec("Create subshell"),
    "delete_subshell_request": _sec("Delete subshell"),
    "delete_subshell_reply": _sec("Delete subshell"),
    "list_subshell_request": _sec("List subshell"),
    "list_subshell_reply": _sec("List subshell"),
    "iopub_welcome": _sec("Welcome message") + " (JEP 65)",
    "stream": _sec("Streams (stdout, stderr, etc)"),
    "display_data": _sec("Display Data"),
    "update_display_data": _sec("Update Display Data"),
    "execute_input": _sec("Code inputs"),
    "execute_result": _sec("Execution results"),
    "error": _sec("Execution errors"),
    "status": _sec("Kernel status"),
    "clear_output": _sec("Clear output"),
    "debug_event": _sec("Debug event"),
    "input_request": _sec("Messages on the stdin (ROUTER/DEALER) channel"),
    "input_reply": _sec("Messages on the stdin (ROUTER/DEALER) channel"),
    "comm_open": _sec("Custom Messages") + ", Opening a Comm",
    "comm_msg": _sec("Custom Messages") + ", Comm Messages",
    "comm_close": _sec("Custom Messages") + ", Tearing Down Comms",
}

_COMM = ("comm_open", "comm_msg", "comm_close")
_SUBSHELL = ("create_subshell", "delete_subshell", "list_subshell")
_SHELL_REQ = ("execute", "inspect", "complete", "history", "is_complete", "connect", "comm_info", "kernel_info")
_CONTROL_REQ = ("shutdown", "interrupt", "kernel_info", "debug", *_SUBSHELL)
_IOPUB = (
    "iopub_welcome",
    "stream",
    "display_data",
    "update_display_data",
    "execute_input",
    "execute_result",
    "error",
    "status",
    "clear_output",
    "debug_event",
)

#: Channels each known message type travels on.
CHANNELS: dict[str, frozenset[str]] = {}
for _r in _SHELL_REQ:
    CHANNELS[f"{_r}_request"] = CHANNELS[f"{_r}_reply"] = frozenset({"shell"})
for _r in _CONTROL_REQ:
    CHANNELS[f"{_r}_request"] = CHANNELS[f"{_r}_reply"] = frozenset({"control"})
CHANNELS["kernel_info_request"] = CHANNELS["kernel_info_reply"] = frozenset({"shell", "control"})
for _t in _IOPUB:
    CHANNELS[_t] = frozenset({"iopub"})
for _t in _COMM:
    CHANNELS[_t] = frozenset({"shell", "iopub"})
CHANNELS["input_request"] = CHANNELS["input_reply"] = frozenset({"stdin"})

#: Message types a client sends to a kernel.
CLIENT_TYPES = frozenset(
    {t for t in CHANNELS if t.endswith("_request") and t != "input_request"} | set(_COMM) | {"input_reply"}
)
#: Message types a kernel sends.
KERNEL_TYPES = frozenset(
    {t for t in CHANNELS if t.endswith("_reply") and t != "input_reply"} | set(_IOPUB) | set(_COMM) | {"input_request"}
)
#: Every message type of protocol 5.5.
KNOWN_MSG_TYPES = frozenset(CHANNELS)

#: Deprecated uses: (msg_type, channel) -> what the spec says instead.
_DEPRECATED_ON = {
    ("shutdown_request", "shell"): "shutdown_request on the control channel (shell deprecated since 5.4)",
}
_DEPRECATED_TYPES = {
    "connect_request": "no connect_request (deprecated since 5.1)",
    "connect_reply": "no connect_reply (deprecated since 5.1)",
}

#: Replies whose ``status`` is ok / error / aborted (spec "Request-Reply").
_STATUS_REPLIES = frozenset(
    {
        "execute_reply",
        "inspect_reply",
        "complete_reply",
        "history_reply",
        "comm_info_reply",
        "kernel_info_reply",
        "shutdown_reply",
        "interrupt_reply",
        "create_subshell_reply",
        "delete_subshell_reply",
        "list_subshell_reply",
    }
)

# -- schemas -------------------------------------------------------------------

_INT: dict[str, Any] = {"type": "integer"}
_STR: dict[str, Any] = {"type": "string"}
_BOOL: dict[str, Any] = {"type": "boolean"}
_OBJ: dict[str, Any] = {"type": "object"}
_STRS: dict[str, Any] = {"type": "array", "items": _STR}


def _fragments() -> dict[str, dict[str, Any]]:
    """msgspec_v5's fragments, corrected and completed for protocol 5.5."""
    f: dict[str, dict[str, Any]] = copy.deepcopy(_JKT_FRAGMENTS)

    def props(msg_type: str, **kw: dict[str, Any]) -> None:
        f[msg_type]["properties"].update(kw)

    # msgspec_v5 says "number" where the spec says int.
    props("execute_reply", execution_count=_INT)
    props("execute_input", execution_count=_INT)
    props("execute_result", execution_count=_INT)
    props("inspect_request", cursor_pos=_INT)
    props("complete_request", cursor_pos=_INT)
    props("complete_reply", cursor_start=_INT, cursor_end=_INT)
    props("history_request", session=_INT, start=_INT, stop=_INT, n=_INT)
    props("connect_reply", **{f"{c}_port": _INT for c in ("shell", "iopub", "stdin", "hb", "control")})
    # The spec: "'password' : bool" (msgspec_v5 has "number").
    props("input_request", password=_BOOL)
    # Request fields with a documented default (or read with one by every
    # kernel) are optional; msgspec_v5 requires every listed key.
    f["execute_request"]["required"] = ["code"]
    f["inspect_request"]["required"] = ["code", "cursor_pos"]
    f["complete_request"]["required"] = ["code", "cursor_pos"]
    f["shutdown_request"]["required"] = []
    # kernel_info_reply: language_info's fields and 5.5's supported_features.
    props(
        "kernel_info_reply",
        language_info={
            "type": "object",
            "properties": {
                "name": _STR,
                "version": _STR,
                "mimetype": _STR,
                "file_extension": _STR,
                "pygments_lexer": _STR,
                "codemirror_mode": {"type": ["string", "object"]},
                "nbconvert_exporter": _STR,
            },
            "required": ["name", "version", "mimetype", "file_extension"],
        },
        supported_features=_STRS,
        help_links={
            "type": "array",
            "items": {"type": "object", "properties": {"text": _STR, "url": _STR}, "required": ["text", "url"]},
        },
    )
    # history entries are checked by _history_entries (tuples of 2 shapes).
    props("history_reply", history={"type": "array"})
    # Missing from msgspec_v5.
    f["iopub_welcome"] = {"properties": {"subscription": _STR}}
    f["comm_open"] = {
        "properties": {
            "comm_id": _STR,
            "target_name": _STR,
            "data": _OBJ,
            "target_module": {"type": ["string", "null"]},
        },
        "required": ["comm_id", "target_name", "data"],
    }
    f["comm_msg"] = {"properties": {"comm_id": _STR, "data": _OBJ}, "required": ["comm_id", "data"]}
    f["comm_close"] = {"properties": {"comm_id": _STR, "data": _OBJ}, "required": ["comm_id", "data"]}
    # Debug messages: the DAP envelope only (spec "Debug request", DAP 1.39).
    f["debug_request"] = {
        "properties": {"type": {"enum": ["request"]}, "seq": _INT, "command": _STR, "arguments": _OBJ},
        "required": ["type", "command"],
    }
    f["debug_reply"] = {
        "properties": {
            "type": {"enum": ["response"]},
            "seq": _INT,
            "request_seq": _INT,
            "success": _BOOL,
            "command": _STR,
            "message": _STR,
            "body": {},
        },
        "required": ["type", "success", "command"],
    }
    f["debug_event"] = {
        "properties": {"type": {"enum": ["event"]}, "seq": _INT, "event": _STR, "body": {}},
        "required": ["type", "event"],
    }
    # Subshells (JEP 91).
    f["create_subshell_request"] = {"properties": {}}
    f["create_subshell_reply"] = {"properties": {"status": {}, "subshell_id": _STR}}
    f["delete_subshell_request"] = {"properties": {"subshell_id": _STR}}
    f["delete_subshell_reply"] = {"properties": {"status": {}}}
    f["list_subshell_request"] = {"properties": {}}
    f["list_subshell_reply"] = {"properties": {"status": {}, "subshell_id": _STRS}}
    return f


_FRAGMENTS = _fragments()

_ERROR_REPLY: dict[str, Any] = {
    "properties": {"ename": _STR, "evalue": _STR, "traceback": _STRS},
    "required": ["ename", "evalue", "traceback"],
}


@functools.cache
def _validator(kind: str) -> Draft4Validator:
    """A cached validator for one content schema ('msg_type' or 'error-reply')."""
    frag = _ERROR_REPLY if kind == "error-reply" else _FRAGMENTS[kind]
    schema: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": True}
    schema.update(copy.deepcopy(frag))
    if "required" not in schema:
        schema["required"] = sorted(schema["properties"])
    if not schema["required"]:
        del schema["required"]  # draft 4 wants a non-empty list
    return Draft4Validator(schema)


_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "object": "an object",
    "array": "an array",
    "null": "null",
}


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _expected_words(validator: str, value: Any) -> str:
    if validator == "type":
        kinds = value if isinstance(value, list) else [value]
        return " or ".join(_TYPE_WORDS.get(str(k), str(k)) for k in kinds)
    if validator == "enum":
        return "one of " + ", ".join(repr(v) for v in value)
    if validator == "additionalProperties":
        return "MIME types as keys (type/subtype)"
    if validator == "minItems":
        return f"at least {value} items"
    if validator == "maxItems":
        return f"at most {value} items"
    return f"{validator} {value!r}"


def _schema_violations(kind: str, content: Any, prefix: str, section: str) -> list[Violation]:
    out: list[Violation] = []
    seen_required: set[str] = set()
    for err in _validator(kind).iter_errors(content):
        path = ".".join(str(p) for p in err.absolute_path)
        where = f"{prefix}.{path}" if path else prefix
        if err.validator == "required" and isinstance(err.instance, Mapping):
            # one error per missing key, each carrying the whole list: report each key once
            if where not in seen_required:
                seen_required.add(where)
                for name in err.validator_value:
                    if name not in err.instance:
                        out.append(Violation(f"{where}.{name}", "present", "missing", section))
            continue
        if err.validator == "additionalProperties" and isinstance(err.instance, Mapping):
            bad = sorted(k for k in err.instance if not _MIME.match(str(k)))
            out.append(Violation(where, _expected_words("additionalProperties", None), _short(bad), section))
            continue
        out.append(
            Violation(where, _expected_words(str(err.validator), err.validator_value), _short(err.instance), section)
        )
    return out


_MIME = re.compile(r"^[\w\-\+\.]+/[\w\-\+\.]+$")

# -- header ----------------------------------------------------------------

_ISO8601 = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})(?::(\d{2})(\.\d+)?)?(Z|[+-]\d{2}(?::?\d{2})?)?$")
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?$")


def is_iso8601(value: Any) -> bool:
    """True if ``value`` is an ISO 8601 timestamp (date and time, optional
    fraction and offset) with valid field values, or a ``datetime``."""
    if isinstance(value, datetime):
        return True
    if not isinstance(value, str):
        return False
    m = _ISO8601.match(value)
    if m is None:
        return False
    year, month, day, hour, minute, second, frac, tz = m.groups()
    offset = tz or ""
    if offset == "Z":
        offset = "+00:00"
    elif offset and ":" not in offset:
        offset = f"{offset[:3]}:{offset[3:] or '00'}"
    text = f"{year}-{month}-{day}T{hour}:{minute}:{second or '00'}{(frac or '')[:7]}{offset}"
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


def validate_header(header: Any, *, where: str = "header", section: str = SEC_HEADER) -> list[Violation]:
    """Violations of one header (spec "Message Header").

    ``where`` prefixes the field names (``header`` or ``parent_header``).
    """
    if not isinstance(header, Mapping):
        return [Violation(where, "an object", _short(header), section)]
    out: list[Violation] = []
    for name in ("msg_id", "msg_type", "session", "username"):
        value = header.get(name)
        if name not in header:
            out.append(Violation(f"{where}.{name}", "a string", "missing", section))
        elif not isinstance(value, str):
            out.append(Violation(f"{where}.{name}", "a string", _short(value), section))
        elif name in ("msg_id", "msg_type", "session") and not value:
            out.append(Violation(f"{where}.{name}", "a non-empty string", "''", section))
    if "date" not in header:
        out.append(Violation(f"{where}.date", "an ISO 8601 timestamp (mandatory since 5.1)", "missing", section))
    elif not is_iso8601(header["date"]):
        out.append(Violation(f"{where}.date", "an ISO 8601 timestamp", _short(header["date"]), section))
    version = header.get("version")
    if "version" not in header:
        out.append(Violation(f"{where}.version", "a protocol version '5.x' (since 5.0)", "missing", section))
    elif not isinstance(version, str) or not _VERSION.match(version):
        out.append(Violation(f"{where}.version", "a protocol version string 'X.Y'", _short(version), section))
    elif _VERSION.match(version).group(1) != "5":  # type: ignore[union-attr]
        out.append(Violation(f"{where}.version", "major version 5", _short(version), section))
    if "subshell_id" in header and not isinstance(header["subshell_id"], (str, type(None))):
        out.append(Violation(f"{where}.subshell_id", "a string or null", _short(header["subshell_id"]), section))
    return out


# -- content ---------------------------------------------------------------


def validate_content(msg_type: str, content: Any) -> list[Violation]:
    """Violations of ``content`` for ``msg_type``; [] for unknown types."""
    section = SECTIONS.get(msg_type)
    if section is None:
        return []
    if not isinstance(content, Mapping):
        return [Violation("content", "an object", _short(content), SEC_FORMAT)]
    fast = _FAST.get(msg_type)
    if fast is not None and fast(content):
        return []  # the hot IOPub types, checked without jsonschema when they conform
    out: list[Violation] = []
    if msg_type in _STATUS_REPLIES:
        out.extend(_reply_status(msg_type, content, section))
    elif msg_type == "is_complete_reply" and content.get("status") == "error":
        # its status names the verdict, but a failed request is still an error reply
        out.extend(_schema_violations("error-reply", content, "content", SEC_REQUEST_REPLY))
    else:
        out.extend(_schema_violations(msg_type, content, "content", section))
    rule = _RULES.get(msg_type)
    if rule is not None:
        out.extend(rule(content, section))
    return out


def _reply_status(msg_type: str, content: Mapping[str, Any], section: str) -> list[Violation]:
    """The status rules of spec "Request-Reply" and "Execution results".

    ``execute_reply.execution_count`` is an integer when ``ok`` (the
    schema requires it) and, when present, when ``error``. An error reply
    may leave it out: the spec's error reply omits "the usual content of a
    successful reply", its deprecated ``abort`` form has no field but
    ``status``, and msgspec_v5's error-reply schema has no count. A kernel
    must leave it out for a request that never ran, since JupyterLab
    shows the reply's count as the cell's prompt number (docs/compatibility.md).
    """
    status = content.get("status")
    out: list[Violation] = []
    count = content.get("execution_count")
    if msg_type == "execute_reply" and status == "error" and "execution_count" in content and not _is_int(count):
        got = _short(count)
        out.append(Violation("content.execution_count", "an integer, when present", got, SEC_REQUEST_REPLY))
    if status == "ok":
        out.extend(_schema_violations(msg_type, content, "content", section))
    elif status == "error":
        out.extend(_schema_violations("error-reply", content, "content", SEC_REQUEST_REPLY))
    elif status == "aborted":
        out.append(
            Violation(
                "content.status", "'error' (kernels should not send 'aborted')", "'aborted'", SEC_REQUEST_REPLY, True
            )
        )
    else:
        got = "missing" if "status" not in content else _short(status)
        out.append(Violation("content.status", "one of 'ok', 'error'", got, SEC_REQUEST_REPLY))
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _rule_is_complete(content: Mapping[str, Any], section: str) -> list[Violation]:
    if content.get("status") == "incomplete" and not isinstance(content.get("indent"), str):
        got = "missing" if "indent" not in content else _short(content["indent"])
        return [Violation("content.indent", "a string when status is 'incomplete'", got, section)]
    return []


def _rule_transient(content: Mapping[str, Any], section: str, *, required: bool) -> list[Violation]:
    transient = content.get("transient")
    if transient is None and not required:
        return []
    if not isinstance(transient, Mapping):
        got = "missing" if "transient" not in content else _short(transient)
        return [Violation("content.transient", "an object with a display_id", got, section)]
    if ("display_id" in transient or required) and not isinstance(transient.get("display_id"), str):
        got = "missing" if "display_id" not in transient else _short(transient["display_id"])
        return [Violation("content.transient.display_id", "a string", got, section)]
    return []


def _rule_history(content: Mapping[str, Any], section: str) -> list[Violation]:
    entries = content.get("history")
    if content.get("status") != "ok" or not isinstance(entries, list):
        return []
    for i, entry in enumerate(entries):
        where = f"content.history.{i}"
        ok = isinstance(entry, (list, tuple)) and len(entry) == 3 and _is_int(entry[0]) and _is_int(entry[1])
        if ok:
            item = entry[2]
            ok = isinstance(item, str) or (
                isinstance(item, (list, tuple))
                and len(item) == 2
                and isinstance(item[0], str)
                and isinstance(item[1], (str, type(None)))
            )
        if not ok:
            return [
                Violation(where, "(session: int, line: int, input: str or (input, output))", _short(entry), section)
            ]
    return []


def _rule_complete(content: Mapping[str, Any], section: str) -> list[Violation]:
    start, end = content.get("cursor_start"), content.get("cursor_end")
    if content.get("status") == "ok" and _is_int(start) and _is_int(end) and start > end:  # type: ignore[operator]
        return [Violation("content.cursor_start", f"<= cursor_end ({end})", repr(start), section)]
    return []


def _rule_kernel_info(content: Mapping[str, Any], section: str) -> list[Violation]:
    version = content.get("protocol_version")
    if content.get("status") == "ok" and isinstance(version, str) and not _VERSION.match(version):
        return [Violation("content.protocol_version", "a version 'X.Y' or 'X.Y.Z'", _short(version), section)]
    return []


_FAST: dict[str, Any] = {
    "stream": lambda c: c.get("name") in ("stdout", "stderr") and isinstance(c.get("text"), str),
    "status": lambda c: c.get("execution_state") in ("busy", "idle", "starting"),
}

_RULES: dict[str, Any] = {
    "is_complete_reply": _rule_is_complete,
    "display_data": lambda c, s: _rule_transient(c, s, required=False),
    "execute_result": lambda c, s: _rule_transient(c, s, required=False),
    "update_display_data": lambda c, s: _rule_transient(c, s, required=True),
    "history_reply": _rule_history,
    "complete_reply": _rule_complete,
    "kernel_info_reply": _rule_kernel_info,
}


# -- whole message ---------------------------------------------------------


def validate_message(
    msg: Any,
    *,
    channel: Channel | None = None,
    sender: Sender | None = None,
) -> list[Violation]:
    """Every violation in one message (see the module docstring).

    Args:
        msg: a dict with ``header``, ``parent_header``, ``metadata``,
            ``content`` and optionally ``buffers`` (jupyter_client's extra
            top-level ``msg_id``/``msg_type`` are ignored).
        channel: the channel it travelled on; checks the type belongs there.
        sender: ``"client"`` or ``"kernel"``; checks that side may send it.

    Returns:
        The violations, header first; ``[]`` when the message conforms.
    """
    if not isinstance(msg, Mapping):
        return [
            Violation("message", "an object with header, parent_header, metadata, content", _short(msg), SEC_FORMAT)
        ]
    out: list[Violation] = []
    for part in ("header", "parent_header", "metadata", "content"):
        if part not in msg:
            out.append(Violation(part, "an object", "missing", SEC_FORMAT))
        elif not isinstance(msg[part], Mapping):
            out.append(Violation(part, "an object", _short(msg[part]), SEC_FORMAT))
    buffers = msg.get("buffers", [])
    if not isinstance(buffers, (list, tuple)) or not all(
        isinstance(b, (bytes, bytearray, memoryview)) for b in buffers
    ):
        out.append(Violation("buffers", "a list of binary buffers", _short(buffers), SEC_FORMAT))
    header = msg.get("header")
    if isinstance(header, Mapping):
        out.extend(validate_header(header))
    parent = msg.get("parent_header")
    if isinstance(parent, Mapping) and parent:
        out.extend(validate_header(parent, where="parent_header", section=SEC_PARENT))
    msg_type = header.get("msg_type") if isinstance(header, Mapping) else None
    if not isinstance(msg_type, str) or msg_type not in KNOWN_MSG_TYPES:
        return out
    section = SECTIONS[msg_type]
    if channel is not None:
        if (msg_type, channel) in _DEPRECATED_ON:
            deprecated = _DEPRECATED_ON[msg_type, channel]
            out.append(Violation("header.msg_type", deprecated, f"{msg_type} on {channel}", section, True))
        elif channel not in CHANNELS[msg_type]:
            allowed = " or ".join(sorted(CHANNELS[msg_type]))
            out.append(Violation("header.msg_type", f"{msg_type} on {allowed}", f"{msg_type} on {channel}", section))
    if sender is not None:
        allowed_types = CLIENT_TYPES if sender == "client" else KERNEL_TYPES
        if msg_type not in allowed_types:
            out.append(Violation("header.msg_type", f"a message type a {sender} sends", repr(msg_type), section))
    if msg_type in _DEPRECATED_TYPES:
        out.append(Violation("header.msg_type", _DEPRECATED_TYPES[msg_type], repr(msg_type), section, True))
    if isinstance(msg.get("content"), Mapping):
        out.extend(validate_content(msg_type, msg["content"]))
    return out
