"""A small, deliberately faulty Jupyter kernel for the conformance suite's own tests.

    python faulty_kernel.py -f CONNECTION_FILE [--fault NAME]...

pyzmq and the standard library only. With no ``--fault`` it is a correct
(if minimal) Python kernel for everything the suite's Python snippets ask:
``exec`` of cells with stdout/stderr captured, ``execute_result`` of a last
expression, ``input``/``getpass`` over stdin, SIGINT interrupts, is_complete
(``codeop``), complete and inspect of names, history, comm_info and unknown
comm targets, iopub_welcome per subscription, HMAC with a replay guard,
stop_on_error that aborts only queued executes, busy/idle around every
request. ``IPython.display`` is replaced by a stand-in whose ``display`` and
``update`` publish display_data / update_display_data. Each ``--fault``
breaks one thing; :data:`FAULTS` lists them. Single-threaded except for the
heartbeat echo thread.
"""

from __future__ import annotations

import ast
import builtins
import codeop
import fnmatch
import getpass
import hashlib
import hmac
import json
import os
import signal
import sys
import threading
import types
import uuid
from datetime import UTC, datetime
from typing import Any

import zmq

FAULTS = {
    "wrong-parent": "complete and inspect replies carry a made-up parent msg_id",
    "no-idle": "no idle status after a request",
    "no-busy": "no busy status before a request",
    "reply-after-idle": "the idle status is published before the reply",
    "no-welcome": "no iopub_welcome at all",
    "welcome-first-only": "iopub_welcome only for the first subscription (XPUB without XPUB_VERBOSE)",
    "duplicate-msg-id": "every message the kernel sends has the same msg_id",
    "bad-date": "header dates are not ISO 8601",
    "bad-version": "header version is '5' instead of '5.x'",
    "no-username": "headers lack the username field",
    "input-after-output": "execute_input is published after the cell's output",
    "bad-signature": "messages are signed with the wrong key",
    "accept-bad-signature": "requests with a wrong signature are executed",
    "accept-replay": "no replay guard: a replayed request runs again",
    "crash-on-malformed": "a malformed message kills the kernel",
    "silent-unknown": "unknown requests get neither busy/idle nor a reply",
    "ok-unknown": "unknown requests get a reply with status ok",
    "password-int": "input_request.password is 1/0, not a boolean",
    "stdin-when-not-allowed": "input_request is sent although allow_stdin is false",
    "count-unstored": "store_history=False advances the execution counter",
    "loud-silent": "silent=True requests still publish execute_input and output",
    "abort-everything": "stop_on_error aborts queued non-execute requests too",
    "no-abort": "stop_on_error is ignored",
    "utf16-cursor": "cursor_pos is read as UTF-16 code units",
    "no-comm-close": "comm_open to an unknown target is not answered with comm_close",
    "hb-blocked": "the heartbeat is answered only between requests",
    "ignore-interrupt": "SIGINT is ignored",
    "no-exit": "the process does not exit after shutdown_request",
    "lossy-flood": "every 10th stream message is dropped",
    "no-execution-count": "execute_reply has no execution_count",
    "ename-repr": "error ename is \"<class 'X'>\" instead of the exception name",
    "fixed-session": "the kernel session id is the same in every process",
    "restart-false": "shutdown_reply always says restart false",
    "hang-execute": "execute_request is never answered",
    "no-stdin-parent": "input_request has an empty parent_header",
    "lossy-pub": "IOPub drops messages for a slow subscriber (no XPUB_NODROP)",
    "handshake-j-only": "a registration file without kernel_id still gets the dialect J short form",
    "debug-failure": "debugInfo is answered with success false",
    "handshake-p-only": "a dialect J registration file gets the dialect P form",
    "hb-wrong-port": "the heartbeat is bound to a random port, not the connection file's",
    "hb-garbled": "the heartbeat echoes other bytes",
    "reply-on-stdin": "stray messages on stdin are answered on stdin",
    "no-control-kernel-info": "kernel_info_request on control goes unanswered",
    "kernel-info-incomplete": "kernel_info_reply's language_info has only a name",
    "stdout-as-stderr": "print() output is published as stderr",
    "result-count-off": "execute_result carries the wrong execution_count",
    "counter-stuck": "the execution counter never advances",
    "no-user-expressions": "user_expressions come back empty",
    "display-id-mismatch": "update_display_data uses another display_id",
    "always-complete": "is_complete says complete for any code",
    "no-matches": "complete_reply never has matches",
    "always-found": "inspect finds any name",
    "no-history": "history_reply is always empty",
    "comms-as-list": "comm_info_reply's comms is a list",
    "comm-no-dispatch": "comm_msg never reaches the comm's handler",
    "abort-despite-false": "stop_on_error=False still aborts the queue",
    "aborted-count": "the replies of aborted cells carry an execution_count",
    "no-shutdown-reply": "shutdown_request is not answered (the process still exits)",
}

DELIM = b"<IDS|MSG>"
STREAM_FLUSH_BYTES = 8192


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class Aborted(Exception):
    pass


class FaultyKernel:
    def __init__(self, info: dict[str, Any], faults: set[str]):
        self.faults = faults
        self.key = info.get("key", "").encode()
        self.sign_key = b"wrong-key" if "bad-signature" in faults else self.key
        self.digest = getattr(hashlib, info.get("signature_scheme", "hmac-sha256").split("-", 1)[1])
        self.session = "faulty-session" if "fixed-session" in faults else uuid.uuid4().hex
        self.fixed_id = uuid.uuid4().hex
        self.ctx = zmq.Context()
        ip = info.get("ip", "127.0.0.1")
        url = f"{info.get('transport', 'tcp')}://{ip}:"
        self.shell = self._bind(zmq.ROUTER, url, info.get("shell_port", 0))
        self.control = self._bind(zmq.ROUTER, url, info.get("control_port", 0))
        self.stdin = self._bind(zmq.ROUTER, url, info.get("stdin_port", 0))
        self.iopub = self.ctx.socket(zmq.XPUB)
        if "welcome-first-only" not in faults:
            self.iopub.setsockopt(zmq.XPUB_VERBOSE, 1)
        if "lossy-pub" not in faults:
            self.iopub.setsockopt(zmq.XPUB_NODROP, 1)
            self.iopub.sndhwm = 0
        if info.get("iopub_port"):
            self.iopub.bind(f"{url}{info['iopub_port']}")
        else:
            self.iopub.bind_to_random_port(url.rstrip(":"))
        self.hb = self._bind(zmq.REP, url, 0 if "hb-wrong-port" in faults else info.get("hb_port", 0))
        self.seen: set[bytes] = set()
        self.count = 1
        self.history: list[tuple[int, int, str]] = []
        self.ns: dict[str, Any] = {"__name__": "__main__", "input": self._input}
        self.parent: dict[str, Any] = {}
        self.idents: list[bytes] = []
        self.allow_stdin = False
        self.silent = False
        self.stream_count = 0
        self.queue: list[tuple[str, list[bytes], dict[str, Any]]] = []
        self.running = True
        self.targets: dict[str, Any] = {}
        self.comms: dict[str, Comm] = {}
        self._install_modules()

    def _bind(self, kind: int, url: str, port: int) -> zmq.Socket[Any]:
        s = self.ctx.socket(kind)
        s.linger = 1000
        if port:
            s.bind(f"{url}{port}")
        else:
            s.bind_to_random_port(url.rstrip(":"))
        return s

    def ports(self) -> dict[str, int]:
        def port(s: zmq.Socket[Any]) -> int:
            return int(s.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])

        socks = {"shell": self.shell, "control": self.control, "stdin": self.stdin, "iopub": self.iopub, "hb": self.hb}
        return {f"{name}_port": port(s) for name, s in socks.items()}

    def register(self, info: dict[str, Any]) -> None:
        """JEP 66: report the ports to the launcher, in the dialect the file asks
        for (J: kernel_id present, short form; P: a full handshake_request)."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.linger = 1000
        dealer.connect(
            f"tcp://{info.get('registration_ip') or info.get('ip', '127.0.0.1')}:{info['registration_port']}"
        )
        ports = self.ports()
        j_form = "kernel_id" in info or "registration_ip" in info or "handshake-j-only" in self.faults
        if j_form and "handshake-p-only" not in self.faults:
            body = json.dumps(
                {"kernel_id": info.get("kernel_id", ""), **{k: str(v) for k, v in ports.items()}}
            ).encode()
            dealer.send_multipart([DELIM, self._sign(self.key, [body]), body])
        else:
            parts = [json.dumps(p).encode() for p in (self.header("handshake_request"), {}, {}, ports)]
            dealer.send_multipart([b"", DELIM, self._sign(self.key, parts), *parts])
        if not dealer.poll(10000):
            raise SystemExit("faulty_kernel: no registration reply")
        dealer.recv_multipart()
        dealer.close()

    # -- wire ------------------------------------------------------------------
    def _sign(self, key: bytes, parts: list[bytes]) -> bytes:
        if not key:
            return b""
        h = hmac.new(key, digestmod=self.digest)
        for p in parts:
            h.update(p)
        return h.hexdigest().encode()

    def header(self, msg_type: str) -> dict[str, Any]:
        h: dict[str, Any] = {
            "msg_id": self.fixed_id if "duplicate-msg-id" in self.faults else uuid.uuid4().hex,
            "msg_type": msg_type,
            "username": "faulty",
            "session": self.session,
            "date": "yesterday at noon" if "bad-date" in self.faults else now_iso(),
            "version": "5" if "bad-version" in self.faults else "5.5",
        }
        if "no-username" in self.faults:
            del h["username"]
        return h

    def send(
        self,
        sock: zmq.Socket[Any],
        msg_type: str,
        content: dict[str, Any],
        parent: dict[str, Any] | None,
        idents: list[bytes] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        if sock is self.iopub and msg_type != "iopub_welcome":
            self.check_subscriptions()  # welcomes go out while a cell runs too
        if sock is self.iopub and msg_type == "stream":
            self.stream_count += 1
            if "lossy-flood" in self.faults and self.stream_count % 10 == 0:
                return
        parts = [json.dumps(p).encode() for p in (self.header(msg_type), parent or {}, metadata or {}, content)]
        prefix = idents if idents is not None else [f"kernel.faulty.{msg_type}".encode()]
        sock.send_multipart([*prefix, DELIM, self._sign(self.sign_key, parts), *parts])

    def reply(self, sock: zmq.Socket[Any], msg: dict[str, Any], content: dict[str, Any]) -> None:
        parent = msg["header"]
        if "wrong-parent" in self.faults and parent.get("msg_type") in ("complete_request", "inspect_request"):
            parent = {**parent, "msg_id": uuid.uuid4().hex}
        msg_type = msg["header"]["msg_type"].rsplit("_", 1)[0] + "_reply"
        self.send(sock, msg_type, content, parent, msg["idents"])

    def status(self, state: str, parent: dict[str, Any]) -> None:
        if (state == "busy" and "no-busy" in self.faults) or (state == "idle" and "no-idle" in self.faults):
            return
        self.send(self.iopub, "status", {"execution_state": state}, parent)

    def parse(self, frames: list[bytes]) -> dict[str, Any] | None:
        try:
            i = frames.index(DELIM)
            sig, parts = frames[i + 1], frames[i + 2 : i + 6]
            if len(parts) < 4:
                raise ValueError("too few frames")
            if "accept-bad-signature" not in self.faults and self.key:
                if not hmac.compare_digest(sig, self._sign(self.key, parts)):
                    return None
                if sig in self.seen and "accept-replay" not in self.faults:
                    return None
                self.seen.add(sig)
            header, parent, metadata, content = (json.loads(p) for p in parts)
            if not all(isinstance(d, dict) for d in (header, parent, metadata, content)):
                raise ValueError("not an object")
            if not isinstance(header.get("msg_type"), str):
                raise ValueError("no msg_type")
        except (ValueError, UnicodeDecodeError):
            if "crash-on-malformed" in self.faults:
                os._exit(3)
            return None
        return {
            "idents": frames[:i],
            "header": header,
            "parent_header": parent,
            "metadata": metadata,
            "content": content,
        }

    # -- the loop --------------------------------------------------------------
    def serve(self) -> int:
        if "ignore-interrupt" in self.faults:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        hb_thread = threading.Thread(target=self._heartbeat, daemon=True)
        if "hb-blocked" not in self.faults:
            hb_thread.start()
        poller = zmq.Poller()
        socks = {self.shell: "shell", self.control: "control", self.stdin: "stdin", self.iopub: "iopub"}
        if "hb-blocked" in self.faults:
            socks[self.hb] = "hb"
        for s in socks:
            poller.register(s, zmq.POLLIN)
        self.send(self.iopub, "status", {"execution_state": "starting"}, {})
        while self.running:
            try:
                if self.queue:
                    self.dispatch(*self.queue.pop(0))
                    continue
                for sock, _ in poller.poll(100):
                    name = socks[sock]
                    frames = sock.recv_multipart()
                    if name == "iopub":
                        self.on_subscription(frames[0])
                    elif name == "hb":
                        sock.send_multipart(frames)
                    else:
                        msg = self.parse(frames)
                        if msg is not None:
                            self.queue.append((name, frames, msg))
            except KeyboardInterrupt:
                continue  # an interrupt while idle
        if hb_thread.is_alive():
            hb_thread.join()
        return 0

    def _heartbeat(self) -> None:
        while self.running:
            if self.hb.poll(100):
                data = self.hb.recv()
                self.hb.send(data[::-1] + b"!" if "hb-garbled" in self.faults else data)

    def check_subscriptions(self) -> None:
        while True:
            try:
                frames = self.iopub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.on_subscription(frames[0])

    def on_subscription(self, frame: bytes) -> None:
        if not frame or frame[0] != 1 or "no-welcome" in self.faults:
            return
        try:
            topic = frame[1:].decode()
        except UnicodeDecodeError:
            return
        self.send(self.iopub, "iopub_welcome", {"subscription": topic}, {}, [frame[1:]])

    def dispatch(self, channel: str, frames: list[bytes], msg: dict[str, Any]) -> None:
        sock = {"shell": self.shell, "control": self.control, "stdin": self.stdin}[channel]
        t = msg["header"]["msg_type"]
        if channel == "stdin":
            if "reply-on-stdin" in self.faults:
                self.send(self.stdin, "conformance_reply", {"status": "ok"}, msg["header"], msg["idents"])
            return  # nothing is pending: stray input_reply and unknown types are ignored
        if channel == "control" and t == "kernel_info_request" and "no-control-kernel-info" in self.faults:
            return
        handler = getattr(self, "do_" + t[: -len("_request")], None) if t.endswith("_request") else None
        if t in ("comm_open", "comm_msg", "comm_close"):
            handler = getattr(self, "do_" + t)
        if handler is None and "silent-unknown" in self.faults:
            return
        self.status("busy", msg["header"])
        content = None
        if handler is None:
            content = (
                {"status": "ok"}
                if "ok-unknown" in self.faults
                else {"status": "error", "ename": "UnknownMessageType", "evalue": t, "traceback": []}
            )
        else:
            content = handler(msg)
        if t == "execute_request" and "hang-execute" in self.faults:
            return
        if t == "execute_request" and content is not None and content.get("status") == "error" and self.abort_after:
            self.collect_queued()  # what is queued now, before the reply, is what stop_on_error aborts
        if content is not None and "reply-after-idle" in self.faults:
            self.status("idle", msg["header"])
            self.reply(sock, msg, content)
            return
        if content is not None:
            self.reply(sock, msg, content)
        self.status("idle", msg["header"])
        if t == "shutdown_request" and "no-exit" not in self.faults:
            self.running = False
        if t == "execute_request" and content is not None and content.get("status") == "error" and self.abort_after:
            self.abort_queued()

    # -- handlers --------------------------------------------------------------
    def do_kernel_info(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {
            "status": "ok",
            "protocol_version": "5.5",
            "implementation": "faulty",
            "implementation_version": "0.1",
            "language_info": {"name": "python"}
            if "kernel-info-incomplete" in self.faults
            else {
                "name": "python",
                "version": sys.version.split()[0],
                "mimetype": "text/x-python",
                "file_extension": ".py",
            },
            "banner": "a deliberately faulty kernel",
            "help_links": [],
            "supported_features": ["debugger"],
        }

    def do_debug(self, msg: dict[str, Any]) -> dict[str, Any]:
        c = msg["content"]
        ok = c.get("command") == "debugInfo" and "debug-failure" not in self.faults
        body = {
            "isStarted": False,
            "hashMethod": "Murmur2",
            "hashSeed": "0",
            "tmpFilePrefix": "/tmp/",
            "tmpFileSuffix": ".py",
            "breakpoints": [],
            "stoppedThreads": [],
            "richRendering": False,
            "exceptionPaths": [],
            "copyToGlobals": False,
        }
        return {
            "type": "response",
            "seq": 1,
            "request_seq": c.get("seq", 0),
            "success": ok,
            "command": c.get("command", ""),
            "body": body if ok else {},
        }

    def do_shutdown(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        if "no-shutdown-reply" in self.faults:
            return None
        restart = bool(msg["content"].get("restart", False)) and "restart-false" not in self.faults
        return {"status": "ok", "restart": restart}

    def do_interrupt(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"status": "ok"}

    def do_comm_info(self, msg: dict[str, Any]) -> dict[str, Any]:
        target = msg["content"].get("target_name")
        comms = {cid: {"target_name": c.target} for cid, c in self.comms.items() if target in (None, c.target)}
        return {"status": "ok", "comms": list(comms) if "comms-as-list" in self.faults else comms}

    def do_comm_open(self, msg: dict[str, Any]) -> None:
        c = msg["content"]
        self.parent = msg["header"]
        handler = self.targets.get(c.get("target_name"))
        if handler is None:
            if "no-comm-close" not in self.faults:
                self.send(self.iopub, "comm_close", {"comm_id": c.get("comm_id"), "data": {}}, msg["header"])
            return
        comm = Comm(self, str(c.get("comm_id")), str(c.get("target_name")))
        self.comms[comm.comm_id] = comm
        handler(comm, msg)

    def do_comm_msg(self, msg: dict[str, Any]) -> None:
        self.parent = msg["header"]
        comm = self.comms.get(msg["content"].get("comm_id"))
        if comm is not None and comm.callback is not None and "comm-no-dispatch" not in self.faults:
            comm.callback(msg)

    def do_comm_close(self, msg: dict[str, Any]) -> None:
        self.comms.pop(msg["content"].get("comm_id"), None)

    def do_is_complete(self, msg: dict[str, Any]) -> dict[str, Any]:
        code = msg["content"].get("code", "")
        try:
            compiled = codeop.compile_command(code, "<cell>", "exec")
        except (SyntaxError, ValueError, OverflowError):
            return {"status": "invalid"}
        if "always-complete" in self.faults:
            return {"status": "complete"}
        if compiled is None:
            return {"status": "incomplete", "indent": "    " if code.rstrip().endswith(":") else ""}
        return {"status": "complete"}

    def _names(self) -> list[str]:
        return sorted(set(self.ns) | set(dir(builtins)))

    def _cursor(self, code: str, pos: int) -> int:
        if "utf16-cursor" in self.faults:  # read pos as UTF-16 units: wrong past a non-BMP char
            units = 0
            for i, ch in enumerate(code):
                if units >= pos:
                    return i
                units += 2 if ord(ch) > 0xFFFF else 1
            return len(code)
        return pos

    def _word(self, code: str, pos: int) -> tuple[int, str]:
        start = pos
        while start > 0 and (code[start - 1].isidentifier() or code[start - 1].isdigit() or code[start - 1] == "_"):
            start -= 1
        return start, code[start:pos]

    def do_complete(self, msg: dict[str, Any]) -> dict[str, Any]:
        code = msg["content"].get("code", "")
        pos = self._cursor(code, int(msg["content"].get("cursor_pos", len(code))))
        start, word = self._word(code, pos)
        matches = [n for n in self._names() if n.startswith(word)] if word and "no-matches" not in self.faults else []
        return {"status": "ok", "matches": matches, "cursor_start": start, "cursor_end": pos, "metadata": {}}

    def do_inspect(self, msg: dict[str, Any]) -> dict[str, Any]:
        code = msg["content"].get("code", "")
        pos = self._cursor(code, int(msg["content"].get("cursor_pos", len(code))))
        _, word = self._word(code, pos)
        obj = self.ns.get(word, getattr(builtins, word, None)) if word else None
        if obj is None and "always-found" in self.faults:
            obj = word
        if obj is None:
            return {"status": "ok", "found": False, "data": {}, "metadata": {}}
        return {
            "status": "ok",
            "found": True,
            "data": {"text/plain": f"{word}: {obj.__doc__ or repr(obj)}"},
            "metadata": {},
        }

    def do_history(self, msg: dict[str, Any]) -> dict[str, Any]:
        c = msg["content"]
        kind = c.get("hist_access_type")
        entries = self.history
        if kind == "tail":
            entries = entries[-int(c.get("n", 10)) :]
        elif kind == "range":
            entries = [e for e in entries if int(c.get("start", 0)) <= e[1] < int(c.get("stop", 1 << 30))]
        elif kind == "search":
            pat = str(c.get("pattern", "*"))
            entries = [e for e in entries if fnmatch.fnmatchcase(e[2], pat)][-int(c.get("n", 10) or 10) :]
        return {"status": "ok", "history": [] if "no-history" in self.faults else [list(e) for e in entries]}

    # -- execute ---------------------------------------------------------------
    abort_after = False

    def do_execute(self, msg: dict[str, Any]) -> dict[str, Any]:
        c = msg["content"]
        code = str(c.get("code", ""))
        self.silent = bool(c.get("silent", False)) and "loud-silent" not in self.faults
        store = bool(c.get("store_history", True)) and not bool(c.get("silent", False))
        self.allow_stdin = bool(c.get("allow_stdin", True))
        self.parent, self.idents = msg["header"], msg["idents"]
        n = self.count
        if (store or "count-unstored" in self.faults) and "counter-stuck" not in self.faults:
            self.count += 1
        if store:
            self.history.append((1, n, code))
        if not self.silent and "input-after-output" not in self.faults:
            self.send(self.iopub, "execute_input", {"code": code, "execution_count": n}, self.parent)
        out, err = sys.stdout, sys.stderr
        sys.stdout = Stream(self, "stderr" if "stdout-as-stderr" in self.faults else "stdout")
        sys.stderr = Stream(self, "stderr")
        error = None
        try:
            self._run(code, n)
        except BaseException as exc:  # KeyboardInterrupt included: an interrupt ends the cell
            error = exc
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = out, err
        if not self.silent and "input-after-output" in self.faults:
            self.send(self.iopub, "execute_input", {"code": code, "execution_count": n}, self.parent)
        reply: dict[str, Any] = {
            "status": "ok",
            "execution_count": n,
            "user_expressions": {}
            if "no-user-expressions" in self.faults
            else self._expressions(c.get("user_expressions") or {}),
            "payload": [],
        }
        self.abort_after = False
        if error is not None:
            name = f"<class '{type(error).__name__}'>" if "ename-repr" in self.faults else type(error).__name__
            err_content = {"ename": name, "evalue": str(error), "traceback": [f"{name}: {error}"]}
            if not self.silent:
                self.send(self.iopub, "error", err_content, self.parent)
            reply = {"status": "error", "execution_count": n, **err_content}
            stop = bool(c.get("stop_on_error", True)) or "abort-despite-false" in self.faults
            self.abort_after = stop and not bool(c.get("silent")) and "no-abort" not in self.faults
        if "no-execution-count" in self.faults:
            reply.pop("execution_count")
        return reply

    def _run(self, code: str, n: int) -> None:
        tree = ast.parse(code)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<cell>", "exec"), self.ns)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), self.ns)
            if value is not None and not self.silent:
                sys.stdout.flush()
                self.send(
                    self.iopub,
                    "execute_result",
                    {
                        "execution_count": n + ("result-count-off" in self.faults),
                        "data": {"text/plain": repr(value)},
                        "metadata": {},
                    },
                    self.parent,
                )

    def _expressions(self, exprs: dict[str, str]) -> dict[str, Any]:
        out = {}
        for key, expr in exprs.items():
            try:
                out[key] = {"status": "ok", "data": {"text/plain": repr(eval(expr, self.ns))}, "metadata": {}}
            except Exception as exc:
                out[key] = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc), "traceback": []}
        return out

    def collect_queued(self) -> None:
        """Move every request waiting in the shell socket into the queue."""
        while True:
            try:
                frames = self.shell.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            msg = self.parse(frames)
            if msg is not None:
                self.queue.append(("shell", frames, msg))

    def abort_queued(self) -> None:
        """stop_on_error: answer the queued executes (all queued requests with
        fault abort-everything) without running them."""
        keep = []
        for channel, frames, msg in self.queue:
            t = msg["header"]["msg_type"]
            if channel == "shell" and (t == "execute_request" or "abort-everything" in self.faults):
                self.status("busy", msg["header"])
                content: dict[str, Any] = {
                    "status": "error",
                    "ename": "ExecutionAborted",
                    "evalue": "aborted",
                    "traceback": [],
                }
                if t == "execute_request" and "aborted-count" in self.faults:
                    content["execution_count"] = self.count
                self.reply(self.shell, msg, content)
                self.status("idle", msg["header"])
            else:
                keep.append((channel, frames, msg))
        self.queue = keep

    # -- stdin -----------------------------------------------------------------
    def _input(self, prompt: str = "", password: bool = False) -> str:
        if not self.allow_stdin and "stdin-when-not-allowed" not in self.faults:
            raise RuntimeError("stdin is not allowed for this request")
        sys.stdout.flush()
        pw: Any = int(password) if "password-int" in self.faults else password
        parent = {} if "no-stdin-parent" in self.faults else self.parent
        self.send(self.stdin, "input_request", {"prompt": prompt, "password": pw}, parent, self.idents)
        while True:
            if self.stdin.poll(100):
                msg = self.parse(self.stdin.recv_multipart())
                if msg is not None and msg["header"]["msg_type"] == "input_reply":
                    return str(msg["content"].get("value", ""))

    def _install_modules(self) -> None:
        getpass.getpass = lambda prompt="Password: ", stream=None: self._input(prompt, True)  # type: ignore[assignment]
        kernel = self

        class Handle:
            def __init__(self, display_id: str):
                self.display_id = display_id

            def update(self, obj: Any) -> None:
                display_id = uuid.uuid4().hex if "display-id-mismatch" in kernel.faults else self.display_id
                kernel.send(
                    kernel.iopub,
                    "update_display_data",
                    {"data": {"text/plain": repr(obj)}, "metadata": {}, "transient": {"display_id": display_id}},
                    kernel.parent,
                )

        def display(obj: Any, display_id: Any = None) -> Handle | None:
            sys.stdout.flush()
            content: dict[str, Any] = {"data": {"text/plain": repr(obj)}, "metadata": {}}
            handle = None
            if display_id:
                handle = Handle(uuid.uuid4().hex if display_id is True else str(display_id))
                content["transient"] = {"display_id": handle.display_id}
            kernel.send(kernel.iopub, "display_data", content, kernel.parent)
            return handle

        manager = types.SimpleNamespace(register_target=lambda name, fn: kernel.targets.__setitem__(name, fn))
        comm_mod = types.ModuleType("comm")
        comm_mod.get_comm_manager = lambda: manager  # type: ignore[attr-defined]
        sys.modules["comm"] = comm_mod
        ipython = types.ModuleType("IPython")
        disp = types.ModuleType("IPython.display")
        disp.display = display  # type: ignore[attr-defined]
        ipython.display = disp  # type: ignore[attr-defined]
        sys.modules["IPython"], sys.modules["IPython.display"] = ipython, disp


class Comm:
    """The kernel side of a comm the frontend opened (the ``comm`` stand-in)."""

    def __init__(self, kernel: FaultyKernel, comm_id: str, target: str):
        self.kernel, self.comm_id, self.target = kernel, comm_id, target
        self.callback: Any = None

    def on_msg(self, callback: Any) -> None:
        self.callback = callback

    def send(self, data: dict[str, Any]) -> None:
        self.kernel.send(self.kernel.iopub, "comm_msg", {"comm_id": self.comm_id, "data": data}, self.kernel.parent)


class Stream:
    """sys.stdout / sys.stderr of a cell: buffered, sent as stream messages."""

    def __init__(self, kernel: FaultyKernel, name: str):
        self.kernel, self.name, self.buf = kernel, name, ""

    def write(self, text: str) -> int:
        self.buf += text
        if len(self.buf) >= STREAM_FLUSH_BYTES:
            self.flush()
        return len(text)

    def flush(self) -> None:
        if self.buf and not self.kernel.silent:
            self.kernel.send(self.kernel.iopub, "stream", {"name": self.name, "text": self.buf}, self.kernel.parent)
        self.buf = ""


def main(argv: list[str]) -> int:
    faults: set[str] = set()
    path = None
    args = iter(argv)
    for a in args:
        if a == "-f":
            path = next(args)
        elif a == "--fault":
            name = next(args)
            if name not in FAULTS:
                print(f"faulty_kernel: unknown fault {name!r}", file=sys.stderr)
                return 2
            faults.add(name)
    if path is None:
        print("faulty_kernel: -f CONNECTION_FILE is required", file=sys.stderr)
        return 2
    with open(path) as f:
        info = json.load(f)
    kernel = FaultyKernel(info, faults)
    if "registration_port" in info:
        kernel.register(info)
    code = kernel.serve()
    # the last replies must leave before the process does: close with a
    # linger and let zmq_ctx_term wait for it (the heartbeat thread has ended)
    kernel.ctx.destroy(linger=5000)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
