"""Checks of start-up (connection-file ports, JEP 66 handshake in both dialects), restart and shutdown.

- ``startup.ports``: a classic kernel listens on exactly the five ports of
  its connection file (kernels.rst "Connection files");
- ``startup.handshake_j``: a kernelspec that declares JEP 66 registers with
  trikernel's provisioner, which writes a dialect J registration file
  (``kernel_id``, ``registration_ip``: the form in jupyter_client's docs);
- ``startup.handshake_p``: the same kernel given a dialect P file (no
  ``kernel_id``: the form Posit's ark and kallichore launchers write)
  registers with a signed ``handshake_request`` (docs/handshake.md);
- ``lifecycle.restart``: shutdown_request(restart=True) is answered, the
  process exits, and the restarted kernel has a new session id;
- ``lifecycle.shutdown`` / ``lifecycle.exit``: shutdown_request is answered
  on control, then the process exits by itself.

Spec: messaging "Kernel shutdown", "Message Header" (the kernel session id
is regenerated on restart), "Kernel startup handshake"; kernels.rst
"Connection files", "Registration file format"; JEP 66.

Runs on: the client side, the suite's thread only (the fresh-phase checks
start kernels of their own from there, through jupyter_client).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import TYPE_CHECKING, Any

import zmq

from trikernel.conformance.catalogue import Ctx, check
from trikernel.conformance.client import Channels
from trikernel.conformance.kernel import HANDSHAKE_PROVISIONER
from trikernel.conformance.verdict import Fail, Skip, Verdict, failed, passed, verdict
from trikernel.errors import ProtocolError
from trikernel.protocol import msgspec
from trikernel.protocol.handshake import PORT_NAMES, Dialect, build_ack_j, build_reply_p, parse_registration_frames
from trikernel.protocol.wire import Signer

if TYPE_CHECKING:
    from trikernel.conformance.received import Received

S = msgspec.SECTIONS
SEC_JEP66 = "messaging § Kernel startup handshake; kernels § Registration file format; JEP 66"


@check("startup.ports", "kernels § Connection files")
def startup_ports(ctx: Ctx) -> Verdict:
    """a classic kernel listens on the five ports of its connection file"""
    if ctx.k.handshake:
        raise Skip("JEP 66 kernelspec: the kernel chooses its ports (see startup.handshake_j)")
    try:
        import psutil
    except ImportError:
        raise Skip("psutil is not installed") from None
    pid = ctx.k.pid()
    if pid is None:
        raise Skip("the provisioner gives no local process")
    want = {int(ctx.ch.info[f"{c}_port"]) for c in ("shell", "iopub", "stdin", "control", "hb")}
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
        have = {c.laddr.port for p in procs for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    except psutil.Error as exc:
        raise Skip(f"cannot list the kernel's sockets: {exc}") from None
    missing = sorted(want - have)
    extra = sorted(have - want)
    fig = (
        f"listening on {len(want & have)} of 5 connection-file ports"
        + (f"; missing {missing}" if missing else "")
        + (f"; also {extra}" if extra else "")
    )
    return verdict(not missing, fig)


@check("startup.handshake_j", SEC_JEP66 + " (dialect J)")
def startup_handshake_j(ctx: Ctx) -> Verdict:
    """a JEP 66 kernelspec registers with the trikernel-handshake provisioner (dialect J file)"""
    if not ctx.k.handshake:
        raise Skip("the kernelspec does not declare JEP 66 (kernel_protocol_version < 5.6)")
    prov = getattr(ctx.k.km, "provisioner", None)
    if not getattr(prov, "uses_handshake", False):
        return failed(f"started by {type(prov).__name__}, not {HANDSHAKE_PROVISIONER}")
    d = ctx.k.dialect
    fig = f"registered in dialect {d} in {ctx.k.started_in:.2f} s; kernel_info after {ctx.k.ready_in:.2f} s more"
    return verdict(d == "J", fig)


def _kernel_cmd(argv: list[str], path: str, resource_dir: str) -> list[str]:
    """The kernelspec argv as jupyter_client formats it ({connection_file}; python -> sys.executable)."""
    out = [a.replace("{connection_file}", path).replace("{resource_dir}", resource_dir) for a in argv]
    major, minor = sys.version_info[:2]
    if out and out[0] in ("python", f"python{major}", f"python{major}.{minor}"):
        out[0] = sys.executable
    return out


@check("startup.handshake_p", SEC_JEP66 + " (dialect P: Posit ark/kallichore, docs/handshake.md)", phase="fresh")
def startup_handshake_p(ctx: Ctx) -> Verdict:
    """given a registration file without kernel_id, the kernel registers with a signed handshake_request"""
    spec = ctx.k.spec
    if not ctx.k.handshake:
        raise Skip("the kernelspec does not declare JEP 66 (kernel_protocol_version < 5.6)")
    cfg = ((spec.metadata or {}).get("kernel_provisioner") or {}).get("config") or {}
    key = uuid.uuid4().hex.encode()
    signer = Signer(key, "hmac-sha256")
    zctx = ctx.k.context
    router = zctx.socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    tmp = tempfile.mkdtemp(prefix="conformance-reg-")
    path = os.path.join(tmp, "registration-p.json")
    reg = {
        "transport": "tcp",
        "ip": "127.0.0.1",
        "registration_port": str(port) if cfg.get("registration_port_format") == "str" else port,
        "key": key.decode(),
        "signature_scheme": "hmac-sha256",
        "kernel_name": ctx.k.name,
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(reg, f)
    env = {**os.environ, **(spec.env or {})}
    cmd = _kernel_cmd(list(spec.argv), path, spec.resource_dir)
    log = open(ctx.k.log_path, "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True)
    ch: Channels | None = None
    t0 = time.monotonic()
    try:
        registration = None
        rejected: list[str] = []
        while registration is None:
            if time.monotonic() - t0 > ctx.t.start:
                return failed(
                    f"no registration within {ctx.t.start:g} s" + (f"; rejected: {rejected}" if rejected else "")
                )
            if proc.poll() is not None:
                return failed(
                    f"the kernel exited with code {proc.returncode} before registering (log: {ctx.k.log_tail(300)})"
                )
            if not router.poll(50):
                continue
            frames = router.recv_multipart()
            try:
                prefix, registration = parse_registration_frames(frames, signer)
            except ProtocolError as exc:
                rejected.append(str(exc))
                registration = None
                continue
            body = (
                build_reply_p(signer, registration.request_header)
                if registration.dialect is Dialect.P
                else build_ack_j(signer)
            )
            router.send_multipart([*prefix, *body])
        dt = time.monotonic() - t0
        info: dict[str, Any] = {"transport": "tcp", "ip": "127.0.0.1", "key": key, "signature_scheme": "hmac-sha256"}
        info.update({name: registration.ports[name] for name in PORT_NAMES})
        ch = Channels(info, ctx.k.audit, zctx)
        ch.wait_connected(ctx.t.start)
        h = ch.send("shell", "kernel_info_request", {})
        reply = ch.reply(h, ctx.t.start)
        fig = f"registered in dialect {registration.dialect.value} after {dt:.2f} s; "
        fig += f"kernel_info {reply.content.get('status')}"
        if registration.dialect is not Dialect.P:
            return failed(fig + " (a P launcher's REP socket cannot read the J short form)")
        return passed(fig)
    finally:
        router.close(linger=0)
        if ch is not None:
            with contextlib.suppress(Exception):
                ch.send("control", "shutdown_request", {"restart": False})
                ch.pump(0.2)
            ch.close()
        try:
            proc.wait(ctx.t.exit)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
            os.rmdir(tmp)


# -- restart and shutdown ----------------------------------------------------------


def _shutdown(ctx: Ctx, restart: bool) -> Received:
    h = ctx.ch.send("control", "shutdown_request", {"restart": restart})
    try:
        return ctx.ch.reply(h, ctx.t.reply, channel="control")
    except Fail:
        raise Fail(f"no shutdown_reply on control within {ctx.t.reply:g} s") from None


def _session_now(ctx: Ctx) -> str:
    r, _ = ctx.ch.request("shell", "kernel_info_request", {}, ctx.t.reply)
    return str(r.header.get("session"))


@check(
    "lifecycle.restart",
    S["shutdown_reply"] + "; " + msgspec.SEC_HEADER + " (kernel session id regenerated on restart)",
    phase="final",
)
def lifecycle_restart(ctx: Ctx) -> Verdict:
    """shutdown_request(restart=True) is answered with restart true, the process exits, the restarted kernel has a new
    session"""
    before = _session_now(ctx)
    r = _shutdown(ctx, True)
    c = r.content
    code, waited = ctx.k.wait_exit(ctx.t.exit)
    exited = f"exited (code {code}) after {waited:.2f} s" if code is not None else f"still running after {waited:.0f} s"
    ctx.k.restart()
    after = _session_now(ctx)
    fig = (
        f"shutdown_reply {c.get('status')} restart={c.get('restart')!r}; {exited}; "
        f"restarted in {ctx.k.started_in:.1f} s, session {'new' if after != before else 'unchanged'}"
    )
    return verdict(c.get("status") == "ok" and c.get("restart") is True and code is not None and after != before, fig)


@check("lifecycle.shutdown", S["shutdown_reply"], phase="final")
def lifecycle_shutdown(ctx: Ctx) -> Verdict:
    """shutdown_request on control is answered: status ok, restart false"""
    r = _shutdown(ctx, False)
    ctx.notes["shutdown_at"] = time.monotonic()
    c = r.content
    return verdict(
        c.get("status") == "ok" and c.get("restart") is False,
        f"shutdown_reply {c.get('status')} restart={c.get('restart')!r}",
    )


@check(
    "lifecycle.exit", S["shutdown_request"] + " (the client can assume the kernel completed shutdown)", phase="final"
)
def lifecycle_exit(ctx: Ctx) -> Verdict:
    """after its shutdown_reply the process exits by itself"""
    if "shutdown_at" not in ctx.notes:
        _shutdown(ctx, False)
        ctx.notes["shutdown_at"] = time.monotonic()
    code, _ = ctx.k.wait_exit(ctx.t.exit)
    since = time.monotonic() - ctx.notes["shutdown_at"]
    if code is None:
        return failed(f"still running {since:.1f} s after the shutdown_reply")
    return passed(f"exited with code {code} {since:.2f} s after the shutdown_reply")
