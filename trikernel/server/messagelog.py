"""``--message-log FILE``: one JSON line per message in and out, written by a thread.

For client and frontend authors (issue 14, docs/conformance.md): what the
kernel received and sent, in the order it happened in the io run.

Where lines come from (all in the io run, the only caller of
:meth:`MessageLog.record`):

- ``in``: :class:`~trikernel.inbound.InboundParser`, for every message read
  on shell, control and stdin — served, refused by ``--strict`` (with its
  ``violations``) or dropped as bad input (with the ``dropped`` kind);
- ``out``: ``RequestServer.send`` (replies on shell and control),
  ``StdinBridge`` (``input_request``), and the iopub task after each IOPub
  message left through libzmq (so the lines are in send order, welcomes
  included).

A line (keys in this order; ``content`` only when its frame is at most
``--message-log-content`` bytes, else ``content_cut``: the first that many
bytes as text)::

    {"time": "2026-12-01T08:40:00.123456Z", "dir": "in", "channel": "shell",
     "identities": ["3f1c..."], "msg_type": "execute_request",
     "header": {...}, "parent_header": {...}, "metadata": {...},
     "content_bytes": 118, "content": {...}}

plus, where they apply: ``buffers`` (their sizes in bytes), ``violations``
and ``deprecated`` (``--strict``), ``dropped`` and ``detail`` (bad input),
``undelivered`` (a reply libzmq could not route: the peer is gone).
Lines with an ``event`` key instead of ``dir`` are the log's own:
``opened``, ``dropped`` (``lines`` lost to a full queue since the last
such line; ``total`` and ``by`` direction and channel since start-up) and
``closed`` (totals, at shutdown).

Never in a line: the signature frame, the HMAC key or the CurveZMQ secret
key (any occurrence of either in a message, as it is or JSON-escaped —
``%connect_info`` prints them — is replaced by ``<redacted>``, a key's head
at the end of a cut content too; keys under 8 characters, which
jupyter_client never makes, are not searched for: they would match
ordinary text), nor the answer to a ``getpass()`` (the ``value`` of an
``input_reply`` to an ``input_request`` with ``password: true``).
Identities are hex. The file is created 0600 and appended to.

Threads: :meth:`record` runs in the io run and only appends to a bounded
deque (``--message-log-queue`` lines): it never blocks on the disk; a
record that finds the queue full is dropped and counted. The writer thread
("trikernel-message-log") parses and formats the frames, writes each batch
with one ``write`` and flushes it. :meth:`statistics` and :meth:`tail` may
be called from any thread (``%trikernel log`` calls them on the main
thread); :meth:`close` from the main thread at shutdown.

Memory: a queued record keeps at most 16 identities and the four JSON
frames, each up to ``max(content bound, 4096)`` bytes (longer frames are
cut before queueing), and only the sizes of buffers; never the signature.
So the queue holds at most about ``queue × 20 × that`` bytes (200 MB at
the defaults; a few hundred bytes per line in practice).

Runs on: the io run (:meth:`MessageLog.record`); the
"trikernel-message-log" writer thread; any thread (``statistics``,
``tail``, ``report``); the main thread (``open``, ``close``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO, cast

from trikernel.errors import ConfigError
from trikernel.protocol.wire import DELIM, Received
from trikernel.server.sockets import COPY_THRESHOLD
from trikernel.threads import not_traced

if TYPE_CHECKING:
    from trikernel.protocol.connection import ConnectionInfo

log = logging.getLogger("trikernel.messagelog")

#: Lines :meth:`MessageLog.tail` can show (kept in memory by the writer).
TAIL_LINES = 1000
#: Frames are kept at least this long (bytes) when queued, so headers parse.
MIN_KEEP = 4096
#: Identities shown per line; more are counted.
MAX_IDENTITIES = 16
#: Buffer (or frame) sizes listed per line at most.
MAX_SIZES = 64
#: Records formatted and written with one ``write`` at most.
WRITE_BATCH = 1024
#: Seconds the writer waits, once woken, before it drains the queue (lines
#: reach the file at most this much later).
GATHER_WINDOW = 0.005
#: Seconds :meth:`MessageLog.close` waits for the writer at shutdown.
CLOSE_TIMEOUT = 2.0
#: Seconds :meth:`MessageLog.tail` waits for lines queued before the call.
TAIL_WAIT = 1.0
REDACTED = "<redacted>"
_DIRS = ("in", "out")
_CHANNELS = ("shell", "control", "stdin", "iopub")

try:  # orjson where installed (the ``fast`` extra), as wire.py
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised when orjson is absent
    _orjson = None  # type: ignore[assignment]


def _loads(data: bytes | str) -> Any:
    return _orjson.loads(data) if _orjson is not None else json.loads(data)


class _Raw:
    """JSON text put into a line as it is."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text


def _unsafe(frame: bytes) -> bool:
    """What keeps a frame from going into a line as it is: a line break (one
    line per message) or a token only Python's json accepts."""
    return b"\n" in frame or b"\r" in frame or b"NaN" in frame or b"Infinity" in frame


def _dumps(obj: Any) -> str:
    if _orjson is not None:
        try:
            return _orjson.dumps(obj).decode()
        except TypeError:
            pass
    return json.dumps(obj, ensure_ascii=False, default=str)


class _Cut:
    """A frame longer than the kept length: its head and its full size."""

    __slots__ = ("head", "size")

    def __init__(self, head: bytes, size: int):
        self.head = head
        self.size = size

    def __len__(self) -> int:
        return self.size


_Frame = bytes | _Cut


#: One queued message, as the io run left it (a tuple: cheapest to build):
#: time, direction, channel, identities (at most MAX_IDENTITIES), how many
#: there were, the four JSON frames (cut past the kept length; None without
#: a delimiter), the sizes of the buffers (of every frame, without a
#: delimiter), the note. The signature and the buffers' bytes are never kept.
_Record = tuple[float, str, str, Sequence[_Frame], int, Sequence[_Frame] | None, Sequence[int], "dict[str, Any] | None"]
_NO_SIZES: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class MessageLogStats:
    """What :meth:`MessageLog.statistics` returns (``%trikernel`` shows it).

    ``path``: the file; ``lines``: message lines formatted (written, unless
    counted in ``unwritten``); ``dropped``: records lost to a full queue,
    with ``dropped_by`` per ``"<dir> <channel>"``; ``unwritten``: lines the
    file refused (an OSError, logged); ``queued``: records waiting now.
    """

    path: str
    lines: int = 0
    dropped: int = 0
    dropped_by: dict[str, int] = field(default_factory=dict)
    unwritten: int = 0
    queued: int = 0


class MessageLog:
    """The message log of one kernel (see the module docstring).

    Create it with :meth:`open` (start-up, main thread); the writer thread
    starts at once. ``content_bytes``: the content bound; ``capacity``: the
    queue's bound in records; ``secrets``: strings never to write (the HMAC
    key, the CurveZMQ secret key).
    """

    def __init__(
        self,
        stream: TextIO,
        path: str,
        *,
        content_bytes: int,
        capacity: int,
        secrets: Sequence[str] = (),
        opened: dict[str, Any] | None = None,
    ):
        self.path = path
        self._file = stream
        self._bound = content_bytes
        self._keep = max(content_bytes, MIN_KEEP)
        self._capacity = capacity
        # a secret as it may appear in a line: itself, and JSON-escaped (a
        # quote or non-ASCII character in a key is escaped in the line).
        # Under 8 characters it would match ordinary text: jupyter_client's
        # keys are UUIDs, so such keys are not searched for (documented).
        forms: list[str] = []
        for secret in secrets:
            if len(secret) < 8:
                continue
            for form in (secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]):
                if form not in forms:
                    forms.append(form)
        self._secrets = tuple(forms)
        #: msg_ids of input_requests with ``password: true`` (writer thread):
        #: the value of the input_reply answering one is never written
        self._password_requests: deque[str] = deque(maxlen=64)
        self._queue: deque[_Record] = deque()
        self._wake = threading.Event()
        # io run only (single producer): plain ints and a dict of fixed keys
        self._enqueued = 0
        self._dropped = 0
        self._dropped_by = {f"{d} {c}": 0 for d in _DIRS for c in _CHANNELS}
        # writer thread
        self._lines = 0
        self._unwritten = 0
        self._reported_dropped = 0
        self._warned_write = False
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._tail_lock = threading.Lock()
        self._progress = threading.Condition()
        self._handled = 0
        self._closing = False
        self._closed = False
        self._thread = not_traced(threading.Thread(target=self._run, name="trikernel-message-log", daemon=True))
        self._event("opened", **(opened or {}))
        self._thread.start()

    @classmethod
    def open(cls, file: str, conn: ConnectionInfo, *, strict: bool, content_bytes: int, capacity: int) -> MessageLog:
        """Open ``file`` (``--message-log``) for appending (created 0600) and
        start the writer; ``conn``'s HMAC key and CurveZMQ secret key are
        never written.

        Args:
            file: the path to append to.
            conn: the connection, for the secrets to redact.
            strict: ``--strict`` is on (recorded in the log's first line).
            content_bytes: bytes of content kept per line (``--message-log-content``).
            capacity: lines waiting for the writer, at most (``--message-log-queue``).

        Raises ConfigError naming ``--message-log`` when the file cannot be
        opened (one line; start-up stops).
        """
        from trikernel import __version__

        secrets = [k.decode("utf-8", "replace") for k in (conn.key, conn.curve_secretkey) if k]
        path = os.path.abspath(file)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            stream = os.fdopen(fd, "w", encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ConfigError(f"--message-log: cannot open {path!r} for writing ({exc.strerror or exc})") from None
        opened = {
            "pid": os.getpid(),
            "trikernel": __version__,
            "strict": strict,
            "content_bound": content_bytes,
            "queue": capacity,
        }
        return cls(
            stream,
            path,
            content_bytes=content_bytes,
            capacity=capacity,
            secrets=secrets,
            opened=opened,
        )

    # -- io run ------------------------------------------------------------------
    def record(
        self, direction: str, channel: str, frames: Sequence[Received], note: dict[str, Any] | None = None
    ) -> None:
        """Queue one message's frames (io run only; never blocks).

        ``direction``: "in" or "out"; ``channel``: shell, control, stdin or
        iopub; ``frames``: as on the wire (identities, delimiter, signature,
        the four JSON frames, buffers); ``note``: extra keys for the line
        (``violations``, ``dropped``, ...). A full queue drops the record
        and counts it.
        """
        if self._closing:
            return
        if len(self._queue) >= self._capacity:
            self._dropped += 1
            key = f"{direction} {channel}"
            if key in self._dropped_by:  # fixed keys: other threads copy this dict
                self._dropped_by[key] += 1
            return
        try:
            i = frames.index(DELIM)
        except ValueError:
            self._queue.append(
                (time.time(), direction, channel, (), 0, None, [len(f) for f in frames[:MAX_SIZES]], note)
            )
        else:
            keep = self._keep
            # a frame over COPY_THRESHOLD is a view of libzmq's buffer (sockets.py): it
            # is cut or copied, so what is kept is bytes (the casts) and frees the buffer
            big = min(keep, COPY_THRESHOLD)
            idents = cast("Sequence[_Frame]", frames[:i] if i <= MAX_IDENTITIES else frames[:MAX_IDENTITIES])
            parts = cast("Sequence[_Frame]", frames[i + 2 : i + 6])  # frames[i + 1] is the signature: not kept
            if max(map(len, parts), default=0) > big:
                parts = _cut(frames[i + 2 : i + 6], keep)
            if idents and max(map(len, idents)) > big:
                idents = _cut(frames[: min(i, MAX_IDENTITIES)], keep)
            sizes = list(map(len, frames[i + 6 : i + 6 + MAX_SIZES])) if len(frames) > i + 6 else _NO_SIZES
            self._queue.append((time.time(), direction, channel, idents, i, parts, sizes, note))
        self._enqueued += 1
        if not self._wake.is_set():
            self._wake.set()

    # -- any thread ----------------------------------------------------------------
    def statistics(self) -> MessageLogStats:
        """The counters now (a snapshot)."""
        by = {k: v for k, v in dict(self._dropped_by).items() if v}
        return MessageLogStats(self.path, self._lines, self._dropped, by, self._unwritten, len(self._queue))

    @property
    def max_tail(self) -> int:
        """The most lines :meth:`tail` and :meth:`report` give (TAIL_LINES)."""
        return TAIL_LINES

    def report(self, n: int) -> list[str]:
        """What ``%trikernel log N`` prints: a header line (path, lines
        written, dropped, unwritten), then the last ``n`` lines, one
        :func:`summary` row each (any thread)."""
        lines = self.tail(n)
        st = self.statistics()
        dropped = f", {st.dropped} dropped ({st.dropped_by})" if st.dropped else ", none dropped"
        unwritten = f", {st.unwritten} not written (disk error)" if st.unwritten else ""
        return [f"message log {st.path}: {st.lines} lines{dropped}{unwritten}; the last {len(lines)}:"] + [
            summary(rec) for rec in lines
        ]

    def tail(self, n: int, *, wait: float = TAIL_WAIT) -> list[dict[str, Any]]:
        """The last ``n`` lines (at most TAIL_LINES), oldest first, as dicts.

        Waits up to ``wait`` seconds for the records queued before the call
        to be formatted, so a cell sees the line of its own request.
        """
        target = self._enqueued
        deadline = time.monotonic() + wait
        with self._progress:
            while self._handled < target and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._progress.wait(left)
        with self._tail_lock:
            lines = list(self._tail)[-n:] if n > 0 else []
        return [json.loads(line) for line in lines]

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Stop taking records, write what is queued and a ``closed`` line,
        close the file (main thread, at shutdown; bounded by ``timeout``:
        a writer stuck on the disk is left behind, a warning says so)."""
        self._closing = True
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning(
                "message log %s: the writer did not finish within %.1fs; %d queued lines are lost",
                self.path,
                timeout,
                len(self._queue),
            )

    # -- writer thread ---------------------------------------------------------------
    def _run(self) -> None:
        while True:
            if not self._queue and not self._closing:
                self._wake.wait()
                if not self._closing and len(self._queue) < WRITE_BATCH:
                    # woken by the first record of a burst: let the io run queue the
                    # rest first, so a burst costs one wake-up and one write, not one
                    # per message (the iopub task's GATHER_WINDOW, for the same reason)
                    time.sleep(GATHER_WINDOW)
            self._wake.clear()  # before draining: a record appended after it wakes us again
            closing = self._closing
            chunk: list[str] = []
            popped = 0
            while self._queue and popped < WRITE_BATCH:
                item = self._queue.popleft()
                popped += 1
                try:
                    line = self._format(item)
                except Exception:  # a line is never worth the writer thread
                    log.exception("message log: could not format a %s %s message", item[1], item[2])
                    line = _dumps({"time": _iso(item[0]), "dir": item[1], "channel": item[2], "unformatted": True})
                chunk.append(line)
            dropped = self._dropped
            if dropped != self._reported_dropped:
                chunk.append(
                    self._event_line(
                        "dropped",
                        lines=dropped - self._reported_dropped,
                        total=dropped,
                        by={k: v for k, v in dict(self._dropped_by).items() if v},
                    )
                )
                self._reported_dropped = dropped
            if closing and not self._queue:
                chunk.append(
                    self._event_line(
                        "closed",
                        lines=self._lines + popped,
                        dropped=dropped,
                        by={k: v for k, v in dict(self._dropped_by).items() if v},
                        unwritten=self._unwritten,
                    )
                )
            self._publish(chunk, popped)
            self._write(chunk)
            if closing and not self._queue:
                break
        with contextlib.suppress(OSError):
            self._file.close()
        with self._progress:
            self._closed = True
            self._progress.notify_all()

    def _publish(self, chunk: list[str], records: int) -> None:
        """Lines formatted (``records`` of them from the queue): into the
        tail, then wake :meth:`tail` waiters."""
        with self._tail_lock:
            self._tail.extend(chunk)
        self._lines += records
        with self._progress:
            self._handled += records
            self._progress.notify_all()

    def _write(self, chunk: list[str]) -> None:
        if not chunk:
            return
        try:
            self._file.write("\n".join(chunk) + "\n")
            self._file.flush()
        except (OSError, ValueError) as exc:
            self._unwritten += len(chunk)
            if not self._warned_write:
                self._warned_write = True
                log.warning("message log %s: cannot write (%s); lines are lost and counted", self.path, exc)

    def _event(self, event: str, **fields: Any) -> None:
        """An event line queued from the constructor (before the thread runs)."""
        line = self._event_line(event, **fields)
        self._write([line])
        with self._tail_lock:
            self._tail.append(line)

    def _event_line(self, event: str, **fields: Any) -> str:
        return _dumps({"time": _iso(time.time()), "event": event, **fields})

    def _format(self, item: _Record) -> str:
        """The line of one record. A JSON frame the kernel made, or parsed
        when it arrived, is put into the line as it came off the wire (no
        parse, no re-encode: most of the writer's time otherwise) unless it
        is cut, spans lines or holds NaN/Infinity; the header is parsed for
        ``msg_type``. Frames of dropped input are always parsed (or cut)."""
        t, direction, channel, idents, n_idents, parts, sizes, note = item
        # stdin lines are parsed (few): getpass answers are redacted below
        trusted = not (note and "dropped" in note) and channel != "stdin"
        rec: dict[str, Any] = {"time": _iso(t), "dir": direction, "channel": channel}
        rec["identities"] = [_head(f).hex() for f in idents]
        if n_idents > len(idents):
            rec["identities_more"] = n_idents - len(idents)
        if parts is None:
            rec["frames"] = list(sizes)  # no delimiter: sizes only
        else:
            names = ("header", "parent_header", "metadata", "content")
            parsed = [self._part(name, f, trusted) for name, f in zip(names, parts, strict=False)]
            header = parsed[0][1] if parsed else None
            if parsed and not isinstance(header, (dict, list, str)) and isinstance(parts[0], bytes):
                try:  # put in as it is: parse it once more, for msg_type
                    header = _loads(parts[0])
                except ValueError:
                    header = None
            rec["msg_type"] = header.get("msg_type") if isinstance(header, dict) else None
            for part, (key, value), f in zip(names, parsed, parts, strict=False):
                if part == "content":
                    rec["content_bytes"] = len(f)
                rec[key] = value
            if len(parts) < 4:
                rec["json_frames"] = len(parts)  # too few frames after the delimiter
            if sizes:
                rec["buffers"] = list(sizes)
        if channel == "stdin":
            self._redact_password(rec)
        if note:
            rec.update(note)
        if _orjson is not None:  # frames as they are: orjson.Fragment
            line = _orjson.dumps(rec).decode("utf-8", "replace")
        else:
            line = "{" + ",".join(f'"{k}":{v.text if isinstance(v, _Raw) else _dumps(v)}' for k, v in rec.items()) + "}"
        for secret in self._secrets:
            if secret in line:
                line = line.replace(secret, REDACTED)
        return line

    def _redact_password(self, rec: dict[str, Any]) -> None:
        """getpass(): remember an input_request with ``password: true``; the
        ``value`` of the input_reply whose parent it is becomes REDACTED
        (a reply with an unknown parent keeps its value: it is not a password)."""
        header, content = rec.get("header"), rec.get("content")
        if not isinstance(header, dict) or not isinstance(content, dict):
            return
        if rec["msg_type"] == "input_request" and content.get("password") is True:
            self._password_requests.append(str(header.get("msg_id")))
        elif rec["msg_type"] == "input_reply":
            parent = rec.get("parent_header")
            if isinstance(parent, dict) and str(parent.get("msg_id")) in self._password_requests and "value" in content:
                rec["content"] = {**content, "value": REDACTED}

    def _part(self, name: str, frame: _Frame, trusted: bool) -> tuple[str, Any]:
        """(key, value) of one JSON frame in a line: as it is (``trusted``,
        see :meth:`_format`) or parsed when whole and within bounds, else
        its head as text under ``<name>_cut``."""
        limit = self._bound if name in ("content", "metadata") else self._keep
        if isinstance(frame, bytes) and len(frame) <= limit:
            if trusted and not _unsafe(frame):
                if _orjson is not None:
                    return name, _orjson.Fragment(frame)
                return name, _Raw(frame.decode("utf-8", "replace"))
            try:
                return name, _loads(frame)
            except ValueError:
                pass  # bad input: shown as text below
        text = _head(frame)[:limit].decode("utf-8", "replace")
        return f"{name}_cut", self._strip_secret_heads(text)

    def _strip_secret_heads(self, text: str) -> str:
        """A cut text must not end in the first characters of a secret."""
        for secret in self._secrets:
            for k in range(min(len(secret) - 1, len(text)), 3, -1):
                if text.endswith(secret[:k]):
                    return text[:-k] + REDACTED
        return text


def _cut(frames: Sequence[Received], keep: int) -> list[_Frame]:
    """Each frame as bytes when within ``keep``, else its head."""
    return [bytes(f) if len(f) <= keep else _Cut(bytes(f[:keep]), len(f)) for f in frames]


def _head(f: _Frame) -> bytes:
    return f.head if isinstance(f, _Cut) else f


_last_second: list[Any] = [None, ""]


def _iso(t: float) -> str:
    """``2026-12-01T08:40:00.123456Z`` (the seconds part cached: the writer
    formats many lines per second)."""
    sec = int(t)
    if _last_second[0] != sec:
        _last_second[0] = sec
        _last_second[1] = datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{_last_second[1]}.{int((t - sec) * 1e6):06d}Z"


def summary(line: dict[str, Any]) -> str:
    """One line of ``%trikernel log``: time, direction, channel, msg_type,
    msg_id, parent, content size and what was wrong, for a message line;
    the event and its counts for the log's own lines."""
    clock = str(line.get("time", ""))[11:26]
    if "event" in line:
        rest = ", ".join(f"{k}={v}" for k, v in line.items() if k not in ("time", "event"))
        return f"{clock} -- {line['event']}: {rest}"
    header = line.get("header")
    header = header if isinstance(header, dict) else {}
    parent = line.get("parent_header")
    parent = parent if isinstance(parent, dict) else {}
    parts = [
        clock,
        f"{line.get('dir', '?'):<3}",
        f"{line.get('channel', '?'):<7}",
        str(line.get("msg_type") or "?"),
        f"id={header.get('msg_id', '?')}",
    ]
    if parent:
        parts.append(f"parent={parent.get('msg_type', '?')}:{parent.get('msg_id', '?')}")
    if "content_bytes" in line:
        parts.append(f"content={line['content_bytes']}B")
    if line.get("violations"):
        parts.append("REFUSED: " + "; ".join(line["violations"]))
    if line.get("deprecated"):
        parts.append("deprecated: " + "; ".join(line["deprecated"]))
    if line.get("dropped"):
        parts.append(f"DROPPED ({line['dropped']}): {line.get('detail', '')}")
    if line.get("undelivered"):
        parts.append("UNDELIVERED")
    return "  ".join(parts)
