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

No sockets, no trio, no zmq here: bytes in, messages out.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import numbers
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .errors import ConfigError, ProtocolError

DELIM = b"<IDS|MSG>"
PROTOCOL_VERSION = "5.5"
#: How many recent signatures the replay guard remembers (count).
REPLAY_WINDOW = 65536

_REQUIRED_HEADER = ("msg_id", "msg_type")


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


def loads(data: bytes) -> Any:
    """Decode one JSON frame. Raises ProtocolError on bad JSON or UTF-8."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"frame is not valid JSON: {exc.__class__.__name__}") from None


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
            hashlib.new(name)
        except (ValueError, TypeError):
            raise ConfigError(
                f"signature_scheme: unknown hash {name!r} (known: {sorted(hashlib.algorithms_available)})"
            ) from None
        self.key = key
        self.scheme = scheme
        self._digest = name
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._window = replay_window

    @property
    def enabled(self) -> bool:
        return bool(self.key)

    def sign(self, parts: Sequence[bytes]) -> bytes:
        """Hex HMAC of ``parts`` (the four JSON frames), or b"" without a key."""
        if not self.key:
            return b""
        # one-shot OpenSSL HMAC: a third of hmac.new + update + hexdigest
        return hmac.digest(self.key, b"".join(parts), self._digest).hex().encode()

    def verify(self, signature: bytes, parts: Sequence[bytes]) -> None:
        """Check ``signature`` over ``parts`` and record it against replay.

        Raises ProtocolError for a missing, wrong or replayed signature.
        """
        if not self.key:
            return
        if not signature:
            raise ProtocolError("message is unsigned but the connection has a key")
        expected = self.sign(parts)
        if not hmac.compare_digest(expected, bytes(signature)):
            raise ProtocolError("bad message signature")
        sig = bytes(signature)
        if sig in self._seen:
            raise ProtocolError("replayed message signature")
        self._seen[sig] = None
        if len(self._seen) > self._window:
            self._seen.popitem(last=False)


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
    buffers: tuple[bytes, ...] = ()
    identities: tuple[bytes, ...] = ()

    @property
    def msg_type(self) -> str:
        return str(self.header["msg_type"])

    @property
    def msg_id(self) -> str:
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


def split_identities(frames: Sequence[bytes]) -> tuple[list[bytes], list[bytes]]:
    """Split at ``<IDS|MSG>``. Raises ProtocolError if the delimiter is absent."""
    for i, f in enumerate(frames):
        if bytes(f) == DELIM:
            return [bytes(x) for x in frames[:i]], [bytes(x) for x in frames[i + 1 :]]
    raise ProtocolError("no <IDS|MSG> delimiter in message frames")


def deserialize(frames: Sequence[bytes], signer: Signer) -> Message:
    """Parse and verify one multipart message.

    Raises ProtocolError for: no delimiter, fewer than 5 frames after it,
    bad/missing/replayed signature, invalid JSON, a non-object frame, or a
    header without msg_id/msg_type.
    """
    identities, rest = split_identities(frames)
    if len(rest) < 5:
        raise ProtocolError(f"expected >= 5 frames after delimiter, got {len(rest)}")
    signature, parts, buffers = rest[0], rest[1:5], rest[5:]
    signer.verify(signature, parts)
    header, parent, metadata, content = (loads(p) for p in parts)
    for name, obj in (("header", header), ("parent_header", parent), ("metadata", metadata), ("content", content)):
        if not isinstance(obj, dict):
            raise ProtocolError(f"{name} frame is not a JSON object")
    for key in _REQUIRED_HEADER:
        if not isinstance(header.get(key), str) or not header.get(key):
            raise ProtocolError(f"header field {key!r} missing or not a string")
    return Message(header, parent, metadata, content, tuple(buffers), tuple(identities))
