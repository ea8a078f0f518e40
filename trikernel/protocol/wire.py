"""Sans-I/O Jupyter wire protocol: frames <-> :class:`Message`.

Follows the messaging spec, section "The Wire Protocol"
(jupyter_client docs/messaging.rst)::

    [ident, ..., b"<IDS|MSG>", hmac_hex, header, parent_header, metadata,
     content, buffer, ...]

The HMAC (``signature_scheme`` "hmac-<hashlib name>", e.g. hmac-sha256) is
computed over the four JSON frames in order. An empty key disables signing
(signature frame is b""). Verification is constant-time
(``hmac.compare_digest``) and every accepted signature is remembered in a
bounded replay guard: a message whose signature was seen before is rejected.

No sockets, no trio, no zmq here: bytes in, messages out. A received frame
may also be a ``memoryview`` (:data:`Received`: the server hands long frames
over as views of the buffer they were received into); nothing here copies
one before its size was checked, and a JSON frame is decoded straight from
it.

Runs on: any thread (pure: bytes in, messages out); a :class:`Signer`'s
replay guard (``verify``, ``remember``) belongs to the io run, which
parses every inbound message.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import numbers
import os
import re
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import accumulate
from typing import TYPE_CHECKING, Any, TypeVar

from trikernel.errors import ConfigError, ProtocolError

if TYPE_CHECKING:
    from collections.abc import Sequence

DELIM = b"<IDS|MSG>"
#: A frame as received: bytes, or a view of the receiver's buffer (a long
#: frame, not copied; server/sockets.py ``COPY_THRESHOLD``).
Received = bytes | memoryview
#: Bytes signed above which :meth:`Signer.sign` feeds the HMAC frame by
#: frame instead of joining the frames into one copy first (64 KiB).
_JOIN_BYTES = 1 << 16
PROTOCOL_VERSION = "5.5"
#: How many recent signatures the replay guard remembers (count).
REPLAY_WINDOW = 65536
#: Hex digits of a signature the replay guard keeps (128 bits of the HMAC).
_REPLAY_KEY_HEX = 32

_REQUIRED_HEADER = ("msg_id", "msg_type")
_F = TypeVar("_F", bytes, Received)


def _stdlib_dumps(obj: Any) -> bytes:
    """json.dumps, and lone surrogates (a non-UTF-8 filename decoded with
    surrogateescape, say) become U+FFFD instead of an exception."""
    text = json.dumps(obj, default=_json_default, ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


try:  # orjson is ~5x faster for the small dicts of the hot path; optional.
    import orjson as _orjson

    def _dumps(obj: Any) -> bytes:
        try:
            return _orjson.dumps(obj, default=_json_default)
        except TypeError:  # int dict keys, lone surrogates, ...: the careful path
            return _stdlib_dumps(obj)

except ImportError:  # pragma: no cover - exercised when orjson is absent
    _orjson = None  # type: ignore[assignment]
    _dumps = _stdlib_dumps


def _json_default(obj: Any) -> Any:
    """What JSON cannot carry natively, as ipykernel's json_clean does it."""
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(obj)).decode("ascii")
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real):
        return float(obj)
    tolist = getattr(obj, "tolist", None)  # numpy arrays and scalars
    if callable(tolist):
        return tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def dumps(obj: Any) -> bytes:
    """JSON-encode ``obj`` to UTF-8 bytes (datetimes as ISO 8601).

    Raises TypeError/ValueError for objects JSON cannot carry.
    """
    return _dumps(obj)


@dataclass(frozen=True, slots=True)
class WireLimits:
    """Bounds on what :func:`deserialize` parses from a peer.

    The messaging spec sets none; these are checked *before* any JSON is
    parsed, so no peer input can make the parser recurse, allocate or work
    without bound. Values and why no real client exceeds them:
    docs/robustness.md.

    - ``max_frames``: frames in one message, identities and buffers
      included (count; default 4096).
    - ``max_json_bytes``: size of each of the four JSON frames (bytes;
      default 64 MiB, 6x the 10 MiB a frontend can send through
      jupyter_server's websocket by default). Buffers are not parsed and
      not bounded here: bound raw size with the ``MAXMSGSIZE`` socket option.
    - ``max_json_depth``: nesting of arrays and objects in one JSON frame
      (levels; default 128: real messages nest < 20 deep, and everything
      accepted can be re-encoded by orjson, whose limit is 254, and by the
      stdlib, whose C recursion fails near 1000).
    """

    max_frames: int = 4096
    max_json_bytes: int = 64 << 20
    max_json_depth: int = 128


DEFAULT_LIMITS = WireLimits()

#: "{" -> "[", "}" -> "]", everything else deleted: only nesting is left.
_TO_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
#: +1 for "[", -1 for "]", indexed by byte value.
_STEP = tuple(1 if c == ord("[") else -1 if c == ord("]") else 0 for c in range(256))
#: Passes of innermost-pair removal before the linear scan takes over.
_PAIR_PASSES = 16
_DEPTH_CHUNK = 1 << 16
#: Bytes of a frame split on quotes at a time when string literals are cut
#: out (_brackets_outside_strings): bounds the pieces alive at once.
_CUT_CHUNK = 1 << 14


def _check_depth(data: bytes, limit: int) -> None:
    """Raise ProtocolError (kind "too_deep") if the JSON text ``data`` nests
    arrays/objects deeper than ``limit``; valid JSON within it always passes.

    C-speed bytes operations only, no parsing. Fast path (nearly every
    message): at most ``limit`` brackets in all. Otherwise string literals
    are cut out (escaped backslashes and quotes first, then every other
    run between quotes), leaving brackets only; each pass of removing
    adjacent "[]" pairs takes exactly one level off, so a text of depth d
    is empty after d passes; a run of more "[" than levels left is too
    deep at once. Past 16 passes, or once a pass removes little (a chain,
    not a tree), the running depth of what is left is followed in chunks,
    stopping at the first chunk past the limit. Where the text is not valid
    JSON this may over-count, never under-count what the parser would
    reach before failing: up to the parser's first error both see the same
    string boundaries.

    Memory: about three times the frame at most, whatever its shape (its
    copy, the brackets left, their join; a copy without escapes where it
    has some), not one object per string literal: the io thread's heap
    keeps what a pre-scan once needed, since glibc returns no thread
    arena's top (docs/robustness.md, "Memory of dropped input").
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return
    if b'"' in data:
        if b"\\" in data:
            data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
        rest = _brackets_outside_strings(data)
    else:
        rest = data.translate(_TO_BRACKETS, _NOT_BRACKETS)
    passes = 0
    while rest and passes < min(limit, _PAIR_PASSES):
        if b"[" * (limit - passes + 1) in rest:
            raise ProtocolError(f"JSON nests deeper than {limit} levels", "too_deep")
        shorter = rest.replace(b"[]", b"")
        passes += 1
        shrunk = len(rest) - len(shorter)
        rest = shorter
        if shrunk * 8 < len(rest):  # few leaves: a deep chain, not a wide tree
            break
    if not rest:
        return
    depth, left = 0, limit - passes
    for start in range(0, len(rest), _DEPTH_CHUNK):
        chunk = rest[start : start + _DEPTH_CHUNK]
        # max over the iterator: no list of 64 Ki ints (which fragments
        # pymalloc's arenas and keeps memory of dropped input resident)
        if max(accumulate(map(_STEP.__getitem__, chunk), initial=depth)) > left:
            raise ProtocolError(f"JSON nests deeper than {limit} levels", "too_deep")
        depth += chunk.count(b"[") - chunk.count(b"]")
    if depth != 0:  # unbalanced: not JSON (the parser will say so, or fail deeper)
        raise ProtocolError(f"JSON nests deeper than {limit} levels or is unbalanced", "too_deep")


def _brackets_outside_strings(data: bytes) -> bytes:
    """The brackets of ``data`` outside its string literals, "{" and "}" as
    "[" and "]"; ``data`` has no escaped quote or backslash left.

    Split on quotes one :data:`_CUT_CHUNK` at a time, carrying whether the
    next chunk starts inside a literal. Splitting the whole frame at once
    made one bytes object per literal: 22 times the frame for a
    100,000-deep ``{"a":{"a":...`` (13 MiB for 586 KiB), which the io
    thread's heap then kept after the frame was dropped.
    """
    kept: list[bytes] = []
    inside = 0  # 1 while the chunk starts inside a string literal
    for start in range(0, len(data), _CUT_CHUNK):
        pieces = data[start : start + _CUT_CHUNK].split(b'"')
        kept.append(b"".join(pieces[inside::2]).translate(_TO_BRACKETS, _NOT_BRACKETS))
        if len(pieces) % 2 == 0:  # an odd number of quotes in this chunk
            inside ^= 1
    return b"".join(kept)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


#: NaN/Infinity are not JSON (RFC 8259): echoed in a parent_header they
#: would make every strict client on IOPub fail to parse the message.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def loads(data: Received, max_depth: int = DEFAULT_LIMITS.max_json_depth) -> Any:
    """Decode one JSON frame (UTF-8; invalid bytes become U+FFFD, as
    jupyter_client's unpacker does, so as ipykernel does).

    ``data`` is decoded to text straight from its buffer (a memoryview is
    not copied to bytes first); only a frame with more brackets than
    ``max_depth`` is copied, for the depth pre-scan, during which its text
    is not held (it is decoded again if the frame passes).

    Raises ProtocolError (kind "too_deep") if it nests deeper than
    ``max_depth``, ProtocolError (kind "invalid_json") for anything else
    the parser refuses, never another exception.
    """
    try:
        text = str(data, "utf-8", "replace")
        # brackets and quotes are ASCII: the same count before and after decoding
        if text.count("[") + text.count("{") > max_depth:
            text = ""  # not held during the pre-scan: a refused frame costs one copy less
            _check_depth(bytes(data), max_depth)
            text = str(data, "utf-8", "replace")
        return _DECODER.decode(text)
    except ProtocolError:
        raise
    except Exception as exc:  # ValueError, RecursionError, MemoryError, ...: the peer's input
        raise ProtocolError(f"frame is not valid JSON: {exc.__class__.__name__}", "invalid_json") from None


def utcnow_iso() -> str:
    """Current time as the ISO 8601 string the spec's header ``date`` uses."""
    return datetime.now(UTC).isoformat()


#: msg_id = "<random per process>_<counter>": unique like a uuid4 but with no
#: syscall per message (uuid4 reads os.urandom, which releases the GIL and
#: lets the io thread preempt the producing cell; see docs/benchmarks.md).
_ID_PREFIX = os.urandom(16).hex()
_ID_COUNTER = itertools.count()


def new_msg_id() -> str:
    """A message id unique across processes and sessions (str)."""
    return f"{_ID_PREFIX}_{next(_ID_COUNTER)}"


def new_header(msg_type: str, session: str, username: str = "kernel") -> dict[str, Any]:
    """A fresh message header (spec: "General Message Format")."""
    return {
        "msg_id": new_msg_id(),
        "msg_type": msg_type,
        "username": username,
        "session": session,
        "date": utcnow_iso(),
        "version": PROTOCOL_VERSION,
    }


def _hmac_hashes() -> list[str]:
    """The hash names HMAC can use here (fixed-size digests), sorted."""
    usable = []
    for name in sorted(hashlib.algorithms_available):
        try:
            hmac.digest(b"", b"", name)
        except (ValueError, TypeError):
            continue
        usable.append(name)
    return usable


class Signer:
    """HMAC signer/verifier for one connection.

    ``key``: the connection file's ``key`` as bytes (empty = no signing).
    ``scheme``: ``"hmac-<name>"`` where name is a hashlib algorithm.
    Raises ConfigError naming ``signature_scheme`` for unknown schemes.
    """

    def __init__(self, key: bytes, scheme: str = "hmac-sha256", replay_window: int = REPLAY_WINDOW):
        if not scheme.startswith("hmac-"):
            raise ConfigError(f"signature_scheme: {scheme!r} is not of the form 'hmac-<hash>'")
        name = scheme[len("hmac-") :]
        try:
            hmac.digest(b"", b"", name)  # what sign() calls: refuses XOFs (shake_*) too
        except (ValueError, TypeError):
            raise ConfigError(
                f"signature_scheme: {scheme!r} cannot sign (HMAC hashes: {', '.join(_hmac_hashes())})"
            ) from None
        self.key = key
        self.scheme = scheme
        self._digest = name
        # the replay guard: the first 128 bits of each remembered signature,
        # as an int in a set, oldest first in a deque (about 85 bytes each, a
        # full window 5.3 MiB; the whole hex signature in an OrderedDict was
        # about 200, 12.5 MiB: docs/robustness.md, "Memory of dropped input")
        self._seen: set[int] = set()
        self._order: deque[int] = deque()
        self._window = replay_window

    @property
    def enabled(self) -> bool:
        """Whether messages are signed and verified: the connection has a non-empty key."""
        return bool(self.key)

    def sign(self, parts: Sequence[Received]) -> bytes:
        """Hex HMAC of ``parts`` (the four JSON frames), or b"" without a key."""
        if not self.key:
            return b""
        if sum(map(len, parts)) > _JOIN_BYTES:  # no joined copy of large frames
            h = hmac.new(self.key, digestmod=self._digest)
            for p in parts:
                h.update(p)
            return h.hexdigest().encode()
        # one-shot OpenSSL HMAC: a third of hmac.new + update + hexdigest
        return hmac.digest(self.key, b"".join(parts), self._digest).hex().encode()

    def verify(self, signature: Received, parts: Sequence[Received]) -> None:
        """Check ``signature`` over ``parts``: present, right, not seen before.

        Raises ProtocolError for a missing, wrong or replayed signature. A
        good one is *not* recorded here: :meth:`remember` it once the
        message was accepted, so that nothing is kept for a message that is
        dropped later (it would fail again if replayed).
        """
        if not self.key:
            return
        if not signature:
            raise ProtocolError("message is unsigned but the connection has a key", "unsigned")
        expected = self.sign(parts)
        if not hmac.compare_digest(expected, signature):  # a view as it is: no copy
            raise ProtocolError("bad message signature", "bad_signature")
        if _replay_key(signature) in self._seen:
            raise ProtocolError("replayed message signature", "replayed")

    def remember(self, signature: Received) -> None:
        """Record an accepted message's signature against replay (bounded:
        the most recent ``replay_window``). Kept: 128 bits of it, not the
        frame: a different message matches them by chance with probability
        2**-128 per remembered signature, and without the key no peer can
        make one that does."""
        if not self.key:
            return
        key = _replay_key(signature)
        if key in self._seen:  # the guard's caller verified it first; kept once
            return
        self._seen.add(key)
        self._order.append(key)
        if len(self._order) > self._window:
            self._seen.discard(self._order.popleft())


def _replay_key(signature: Received) -> int:
    """What the replay guard keeps of a verified signature: its first
    :data:`_REPLAY_KEY_HEX` hex digits as an int (lowercase hex: it equalled
    :meth:`Signer.sign`'s output)."""
    return int(bytes(signature[:_REPLAY_KEY_HEX]), 16)


@dataclass(frozen=True, slots=True)
class Message:
    """One Jupyter message. ``content`` stays a plain dict (spec shapes).

    ``identities`` are the ROUTER routing frames (shell/control/stdin) or
    the topic frame on IOPub.
    """

    header: dict[str, Any]
    parent_header: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    content: dict[str, Any] = field(default_factory=dict)
    buffers: tuple[Received, ...] = ()
    identities: tuple[bytes, ...] = ()

    @property
    def msg_type(self) -> str:
        """The header's ``msg_type`` ("execute_request", "status", ...). Raises KeyError when the
        header has none (a parsed message always has one)."""
        return str(self.header["msg_type"])

    @property
    def msg_id(self) -> str:
        """The header's ``msg_id``. Raises KeyError when the header has none (a parsed message
        always has one)."""
        return str(self.header["msg_id"])


def serialize(msg: Message, signer: Signer) -> list[bytes]:
    """Frames for ``msg``: identities, DELIM, signature, 4 JSON, buffers."""
    parts = [
        dumps(msg.header),
        dumps(msg.parent_header),
        dumps(msg.metadata),
        dumps(msg.content),
    ]
    return [*msg.identities, DELIM, signer.sign(parts), *parts, *(bytes(b) for b in msg.buffers)]


def split_identities(frames: Sequence[_F]) -> tuple[list[bytes], list[_F]]:
    """Split at ``<IDS|MSG>``: the identities as bytes, the frames after
    the delimiter as they are (a view is not copied). Raises ProtocolError
    if the delimiter is absent."""
    for i, f in enumerate(frames):
        if len(f) == len(DELIM) and f == DELIM:
            return [bytes(x) for x in frames[:i]], list(frames[i + 1 :])
    raise ProtocolError("no <IDS|MSG> delimiter in message frames", "no_delimiter")


def deserialize(frames: Sequence[Received], signer: Signer, limits: WireLimits = DEFAULT_LIMITS) -> Message:
    """Parse and verify one multipart message.

    Bounds first (``limits``: frame count, JSON frame sizes), then the
    signature, then JSON (depth checked before parsing), then the header.
    No frame is copied before its size was checked: a JSON frame over the
    limit is dropped as it was received, and the HMAC reads the frames
    where they are. Buffers (the frames after content) are kept as they
    were received (bytes, or a view).

    Raises ProtocolError, whose ``kind`` says what was wrong, for: too many
    frames, no delimiter, fewer than 5 frames after it, a JSON frame over
    the size limit, a bad/missing/replayed signature, invalid or too deeply
    nested JSON, a non-object frame, a header without msg_id/msg_type, a
    header string shaped like an ISO 8601 date that is no date. Never any
    other exception: whatever else goes wrong while turning the peer's
    frames into a message (MemoryError, ...) is a ProtocolError of kind
    "parse_error".
    """
    try:
        return _deserialize(frames, signer, limits)
    except ProtocolError:
        raise
    except Exception as exc:  # the peer's input must never take a channel task down
        raise ProtocolError(f"could not parse message: {exc.__class__.__name__}", "parse_error") from None


def _deserialize(frames: Sequence[Received], signer: Signer, limits: WireLimits) -> Message:
    if len(frames) > limits.max_frames:
        raise ProtocolError(f"{len(frames)} frames in one message (limit {limits.max_frames})", "too_many_frames")
    identities, rest = split_identities(frames)
    if len(rest) < 5:
        raise ProtocolError(f"expected >= 5 frames after delimiter, got {len(rest)}", "too_few_frames")
    signature, parts, buffers = rest[0], rest[1:5], rest[5:]
    for name, part in zip(_PART_NAMES, parts, strict=True):
        if len(part) > limits.max_json_bytes:
            raise ProtocolError(f"{name} frame is {len(part)} bytes (limit {limits.max_json_bytes})", "frame_too_large")
    signer.verify(signature, parts)
    header, parent, metadata, content = (loads(p, limits.max_json_depth) for p in parts)
    for name, obj in zip(_PART_NAMES, (header, parent, metadata, content), strict=True):
        if not isinstance(obj, dict):
            raise ProtocolError(f"{name} frame is not a JSON object", "not_an_object")
    for key in _REQUIRED_HEADER:
        if not isinstance(header.get(key), str) or not header.get(key):
            raise ProtocolError(f"header field {key!r} missing or not a string", "bad_header")
    _check_dates(header)
    signer.remember(signature)
    return Message(header, parent, metadata, content, tuple(buffers), tuple(identities))


_PART_NAMES = ("header", "parent_header", "metadata", "content")
#: jupyter_client's ISO8601_PAT (jsonutil.py): every header string of this
#: shape is turned into a datetime by every jupyter_client reader, and one
#: that is no date makes it raise.
_ISO8601 = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d{1,6})?(Z|([\+\-]\d{2}:?\d{2}))?$")


def _check_dates(header: dict[str, Any]) -> None:
    """Refuse a header with a date-shaped string that is no date.

    The header comes back as ``parent_header`` of the reply and of the
    IOPub status messages every client receives, and jupyter_client's
    ``extract_dates`` parses every date-shaped string in a parent_header
    (recursively) and raises on a bad one: one client's bad header must
    not break the other clients' readers.
    """
    stack: list[Any] = list(header.values())
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if 19 <= len(v) <= 32 and _ISO8601.match(v) and not _is_date(v):
                raise ProtocolError("a header string looks like an ISO 8601 date but is none", "bad_header")
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def _is_date(s: str) -> bool:
    try:
        datetime.fromisoformat(s)
        return True
    except ValueError:
        pass
    try:  # what jupyter_client itself uses (it accepts a few more offsets)
        from dateutil.parser import parse
    except ImportError:  # pragma: no cover - dateutil comes with jupyter_client
        return False
    try:
        parse(s)
        return True
    except (ValueError, OverflowError):
        return False
