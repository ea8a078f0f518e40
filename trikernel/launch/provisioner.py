"""jupyter_client kernel provisioner that starts JEP 66 kernels via the registration handshake.

:class:`HandshakeProvisioner` (entry point ``trikernel-handshake`` in the
group ``jupyter_client.kernel_provisioners``) is a
:class:`jupyter_client.provisioning.LocalProvisioner`. For a kernelspec that
declares the handshake (see :func:`wants_handshake`) one launch goes:

1. bind a ROUTER registration socket (default ``127.0.0.1``, random port);
2. write a registration file (mode 0600, its own path in the Jupyter runtime
   dir, never the path of the real connection file) and substitute it for
   ``{connection_file}`` in the kernelspec argv;
3. launch the kernel, then wait for its registration while watching the
   process: an exit fails the start at once with the exit code and the tail
   of its stderr; the timeout kills the process group with a clear error;
4. verify the HMAC and the ``kernel_id``, reply in the dialect that arrived
   (J short form or P ``handshake_reply``), close the socket;
5. return connection info with integer ports and ``key`` as bytes, which
   ``KernelManager._reconcile_connection_info`` loads and writes to the real
   connection file.

Every other kernelspec gets exactly LocalProvisioner's behaviour. Restart
runs the same steps again: new ports, same key (``km.session.key``).

Owns, per launch, one pyzmq context and its ROUTER socket (closed before
``launch_kernel`` returns or raises), the registration file (removed in
``cleanup``) and, when it captures the kernel's stderr, one daemon thread
that copies the kernel's stderr to ours and keeps a bounded tail.

Spec: JEP 66 (jupyter/enhancement-proposals 66-jupyter-handshaking);
jupyter_client docs/kernels.rst (registration files), docs/provisioning.rst.

Runs on: the client's process: jupyter_client's ``KernelManager`` awaits
it on its asyncio loop; the "trikernel-kernel-stderr" daemon thread
copies the kernel's stderr. :func:`wants_handshake`: any thread (pure).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import zmq
from jupyter_client.launcher import launch_kernel
from jupyter_client.localinterfaces import is_local_ip, local_ips
from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Bool, Enum, Float, Integer, Unicode

from trikernel.errors import HandshakeError, ProtocolError
from trikernel.protocol.connection import write_json_atomic
from trikernel.protocol.handshake import (
    PORT_NAMES,
    Dialect,
    KernelRegistration,
    build_ack_j,
    build_reply_p,
    parse_registration_frames,
)
from trikernel.protocol.wire import Signer

if TYPE_CHECKING:
    from jupyter_client.connect import KernelConnectionInfo

log = logging.getLogger("trikernel.provisioner")

#: Seconds between checks of the registration socket and the process.
POLL_INTERVAL = 0.01
#: Kernelspec metadata key for trikernel's per-kernelspec switches.
METADATA_KEY = "trikernel"
#: Default minimum ``kernel_protocol_version`` that switches the handshake on.
DEFAULT_MIN_PROTOCOL_VERSION = "5.6"


def _version_tuple(text: str) -> tuple[int, ...] | None:
    """``"5.6"`` -> ``(5, 6)``; ``"5.10"`` -> ``(5, 10)``; junk -> None."""
    parts = str(text).strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def wants_handshake(
    kernel_protocol_version: str | None,
    metadata: Mapping[str, Any] | None,
    *,
    override: bool | None = None,
    min_protocol_version: str = DEFAULT_MIN_PROTOCOL_VERSION,
) -> bool:
    """Decide whether a kernelspec gets the JEP 66 handshake.

    In order: ``override`` (provisioner config ``handshake``) if not None;
    else ``metadata["trikernel"]["handshake"]`` if it is a bool; else
    ``kernel_protocol_version`` compared numerically (5.10 > 5.6) with
    ``min_protocol_version``. A missing or unparseable version means no.
    ipykernel's "5.5" therefore stays classic.
    """
    if override is not None:
        return bool(override)
    section = (metadata or {}).get(METADATA_KEY)
    if isinstance(section, Mapping) and isinstance(section.get("handshake"), bool):
        return bool(section["handshake"])
    have = _version_tuple(kernel_protocol_version or "")
    need = _version_tuple(min_protocol_version)
    if have is None or need is None:
        return False
    width = max(len(have), len(need))
    return have + (0,) * (width - len(have)) >= need + (0,) * (width - len(need))


def write_registration_file(path: pathlib.Path, info: Mapping[str, Any]) -> None:
    """Write ``info`` as JSON to ``path``, mode 0600, atomically (its folder
    is created 0700 if missing). Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_json_atomic(path, info)


class _StderrTail:
    """Copies a child's stderr pipe to our fd 2 and keeps the last ``limit`` bytes.

    Owns the read end ``fd``; one daemon thread; exits (and closes ``fd``)
    at EOF, i.e. when the child and all its descendants closed stderr.
    """

    def __init__(self, fd: int, limit: int):
        self._fd = fd
        self._limit = limit
        self._tail = bytearray()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="trikernel-kernel-stderr", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self._fd, 65536)
                except OSError as exc:
                    log.debug("kernel stderr pipe read failed: %s", exc)
                    break
                if not chunk:
                    break
                with self._lock:
                    self._tail += chunk
                    if len(self._tail) > self._limit:
                        del self._tail[: len(self._tail) - self._limit]
                try:
                    os.write(2, chunk)
                except OSError as exc:  # our stderr is gone; keep draining so the kernel never blocks
                    log.debug("cannot forward kernel stderr: %s", exc)
        finally:
            os.close(self._fd)

    def text(self, wait: float = 0.0) -> str:
        """The tail decoded as UTF-8 (replacement chars for bad bytes).

        ``wait``: seconds to wait for EOF first (use after the child exited).
        """
        if wait > 0:
            self._thread.join(wait)
        with self._lock:
            return bytes(self._tail).decode("utf-8", "replace")


class HandshakeProvisioner(LocalProvisioner):
    """LocalProvisioner that uses the JEP 66 handshake where the kernelspec declares it.

    Switch on per kernelspec with ``"kernel_protocol_version": "5.6"`` (or
    higher, compared numerically) or ``"metadata": {"trikernel":
    {"handshake": true}}``; ``{"handshake": false}`` forces classic. All
    traits below can be set in the kernelspec's
    ``metadata.kernel_provisioner.config`` or as traitlets config
    (``c.HandshakeProvisioner.<name>``).

    Raises HandshakeError from ``launch_kernel`` when the kernel exits
    before registering (message has the exit code and stderr tail) or does
    not register within ``handshake_timeout`` seconds (process group killed).
    """

    handshake = Bool(
        None,
        allow_none=True,
        config=True,
        help="Force the handshake on (True) or off (False); None decides from the kernelspec.",
    )
    min_protocol_version = Unicode(
        DEFAULT_MIN_PROTOCOL_VERSION,
        config=True,
        help="kernel_protocol_version (numeric compare) from which the handshake is used.",
    )
    registration_ip = Unicode(
        "127.0.0.1",
        config=True,
        help="Address the registration ROUTER binds (0.0.0.0 for remote/containerised kernels).",
    )
    registration_port = Integer(
        0, min=0, max=65535, config=True, help="Port of the registration socket; 0 = random per launch."
    )
    registration_connect_ip = Unicode(
        "",
        config=True,
        help="Address written into the registration file for the kernel to connect to; "
        "empty = registration_ip (or the kernel ip when registration_ip is a wildcard).",
    )
    registration_port_format = Enum(
        ["int", "str"],
        "int",
        config=True,
        help="How registration_port is written: 'int' (jupyter_client docs, ark, trikernel) "
        "or 'str' (xeus 6 / xeus-python 0.19 require a string).",
    )
    registration_dir = Unicode(
        "", config=True, help="Directory for registration files; empty = the Jupyter runtime dir."
    )
    handshake_timeout = Float(
        30.0, min=0.1, config=True, help="Seconds to wait for the kernel's registration before killing it."
    )
    capture_stderr = Bool(
        True,
        config=True,
        help="Pipe the kernel's stderr through this process (copied to our stderr) "
        "so a failed start can report its tail.",
    )
    stderr_tail_bytes = Integer(4000, min=0, config=True, help="Bytes of kernel stderr kept for error messages.")

    _use_handshake: bool = False
    _registration_path: pathlib.Path | None = None
    _zmq_context: zmq.Context[zmq.Socket[bytes]] | None = None
    _reg_socket: zmq.Socket[bytes] | None = None
    _reg_url: str = ""
    _stderr_tail: _StderrTail | None = None

    # -- decision ----------------------------------------------------------

    @property
    def _km(self) -> Any:
        """The owning KernelManager (``parent``); RuntimeError when there is none."""
        km = self.parent
        if km is None:
            raise RuntimeError("HandshakeProvisioner needs its KernelManager as parent")
        return km

    @property
    def uses_handshake(self) -> bool:
        """Whether this kernelspec is started with the handshake (decided per launch)."""
        spec = self.kernel_spec
        return wants_handshake(
            getattr(spec, "kernel_protocol_version", None),
            getattr(spec, "metadata", None),
            override=self.handshake,
            min_protocol_version=self.min_protocol_version,
        )

    # -- pre_launch ----------------------------------------------------------

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Open the registration socket and write the registration file (handshake kernelspecs).

        Otherwise LocalProvisioner.pre_launch unchanged. Returns the kwargs
        for ``launch_kernel`` with ``cmd`` whose ``{connection_file}`` is
        the registration file. Raises RuntimeError like LocalProvisioner for
        a non-local kernel ip or unsatisfiable transport encryption.
        """
        self._use_handshake = self.parent is not None and self.uses_handshake
        if self._use_handshake and self._km.transport != "tcp":
            log.warning(
                "kernel %s: transport %r has no handshake; starting classic", self.kernel_id, self._km.transport
            )
            self._use_handshake = False
        if not self._use_handshake:
            return await super().pre_launch(**kwargs)
        km = self._km

        self._close_registration()  # a previous failed launch may have left one
        curve_pub, curve_sec = self._prepare_encryption(km, kwargs)
        extra_arguments = kwargs.pop("extra_arguments", [])

        self._zmq_context = zmq.Context()
        sock = self._zmq_context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        bind_host = "0.0.0.0" if self.registration_ip == "*" else self.registration_ip
        host = f"[{bind_host}]" if ":" in bind_host else bind_host
        if ":" in bind_host:
            sock.setsockopt(zmq.IPV6, 1)
        self._reg_socket = sock
        try:
            if self.registration_port:
                sock.bind(f"tcp://{host}:{self.registration_port}")
                port = self.registration_port
            else:
                port = sock.bind_to_random_port(f"tcp://{host}")
        except zmq.ZMQError as exc:
            self._close_registration()
            raise HandshakeError(
                f"cannot bind the registration socket on {bind_host}:{self.registration_port or '*'}: {exc}"
            ) from None
        self._reg_url = f"tcp://{host}:{port}"

        connect_ip = self.registration_connect_ip or (km.ip if bind_host in ("0.0.0.0", "::") else bind_host)
        info: dict[str, Any] = {
            "transport": "tcp",
            "ip": km.ip,
            "registration_ip": connect_ip,
            "registration_port": port if self.registration_port_format == "int" else str(port),
            "kernel_id": self.kernel_id,
            "key": km.session.key.decode(),
            "signature_scheme": km.session.signature_scheme,
            "kernel_name": km.kernel_name,
        }
        if curve_pub is not None and curve_sec is not None:
            info["curve_publickey"] = curve_pub.decode()
            info["curve_secretkey"] = curve_sec.decode()
        jupyter_session = kwargs.get("env", {}).get("JPY_SESSION_NAME", "") if "env" in kwargs else ""
        if jupyter_session:
            info["jupyter_session"] = jupyter_session

        directory = pathlib.Path(self.registration_dir) if self.registration_dir else self._runtime_dir()
        self._registration_path = directory / f"registration-{self.kernel_id}-{uuid.uuid4().hex[:8]}.json"
        try:
            write_registration_file(self._registration_path, info)
        except OSError as exc:
            self._close_registration()
            raise HandshakeError(f"cannot write registration file {self._registration_path}: {exc}") from None

        kernel_cmd = self._format_cmd(km, extra_arguments, str(self._registration_path))
        log.debug("kernel %s: registration socket %s, file %s", self.kernel_id, self._reg_url, self._registration_path)
        return await KernelProvisionerBase.pre_launch(self, cmd=kernel_cmd, **kwargs)

    @staticmethod
    def _runtime_dir() -> pathlib.Path:
        from jupyter_core.paths import jupyter_runtime_dir

        return pathlib.Path(jupyter_runtime_dir())

    def _prepare_encryption(self, km: Any, kwargs: dict[str, Any]) -> tuple[bytes | None, bytes | None]:
        """CurveZMQ keys exactly as LocalProvisioner.pre_launch decides them (jupyter_client 8.10)."""
        transport_encryption = kwargs.pop("transport_encryption", getattr(km, "transport_encryption", "disabled"))
        policy = (
            km._transport_encryption_policy(transport_encryption)
            if hasattr(km, "_transport_encryption_policy")
            else ("auto" if bool(transport_encryption) else "disabled")
        )
        if not is_local_ip(km.ip):
            msg = (
                f"Can only launch a kernel on a local interface. This one is not: {km.ip}. "
                f"Currently valid addresses are: {local_ips()}"
            )
            raise RuntimeError(msg)
        if policy not in {"auto", "required"}:
            return None, None
        supports = policy == "required" or (
            hasattr(km, "_kernel_supports_curve_encryption") and km._kernel_supports_curve_encryption()
        )
        if not supports:
            return None, None
        if getattr(km, "curve_publickey", None) is None:
            km.curve_publickey, km.curve_secretkey = zmq.curve_keypair()
        return km.curve_publickey, km.curve_secretkey

    def _format_cmd(self, km: Any, extra_arguments: list[str], registration_file: str) -> list[str]:
        """KernelManager.format_kernel_cmd, with ``{connection_file}`` -> the registration file."""
        import re

        cmd = list(self.kernel_spec.argv) + list(extra_arguments)
        if cmd and cmd[0] in {"python", f"python{sys.version_info[0]}", "python{}.{}".format(*sys.version_info[:2])}:
            cmd[0] = sys.executable
        ns: dict[str, Any] = {"prefix": sys.prefix, "resource_dir": self.kernel_spec.resource_dir}
        if isinstance(getattr(km, "_launch_args", None), dict):
            ns.update(km._launch_args)
        ns["connection_file"] = registration_file
        pat = re.compile(r"\{([A-Za-z0-9_]+)\}")
        return [pat.sub(lambda m: str(ns.get(m.group(1), m.group())), arg) for arg in cmd]

    # -- launch_kernel -------------------------------------------------------

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Launch the kernel; for handshake kernelspecs wait for and acknowledge its registration.

        Returns connection info: ``transport``, ``ip`` (the address the
        kernel bound), the five ``*_port`` as int, ``key`` bytes,
        ``signature_scheme`` and curve keys when on. Raises HandshakeError
        (process exited / timed out; see class docstring).
        """
        if not self._use_handshake:
            return await super().launch_kernel(cmd, **kwargs)
        km = self._km
        assert self._reg_socket is not None
        scrubbed = LocalProvisioner._scrub_kwargs(kwargs)
        read_fd: int | None = None
        if self.capture_stderr and scrubbed.get("stderr") is None:
            read_fd, write_fd = os.pipe()
            scrubbed["stderr"] = write_fd
        else:
            write_fd = -1
        try:
            self.process = launch_kernel(cmd, **scrubbed)
        except BaseException:
            if read_fd is not None:
                os.close(read_fd)
            self._close_registration()
            self._remove_registration_file()
            raise
        finally:
            if write_fd >= 0:
                os.close(write_fd)
        self._stderr_tail = _StderrTail(read_fd, self.stderr_tail_bytes) if read_fd is not None else None
        self.pid = self.process.pid
        try:
            self.pgid = os.getpgid(self.process.pid) if hasattr(os, "getpgid") else None
        except OSError:
            self.pgid = None
        self.cwd = kwargs.get("cwd", pathlib.Path.cwd())

        try:
            registration = await self._await_registration()
        except BaseException:
            await self._abandon_process()
            raise
        finally:
            await self._close_registration_async()

        info: dict[str, Any] = {
            "transport": "tcp",
            "ip": km.ip,
            **{name: registration.ports[name] for name in PORT_NAMES},
            "signature_scheme": km.session.signature_scheme,
            "key": km.session.key,
        }
        if km.curve_publickey is not None and km.curve_secretkey is not None:
            info["curve_publickey"] = km.curve_publickey.decode()
            info["curve_secretkey"] = km.curve_secretkey.decode()
        self.connection_info = info  # type: ignore[assignment]
        log.info(
            "kernel %s registered (dialect %s): %s",
            self.kernel_id,
            registration.dialect.value,
            {name: registration.ports[name] for name in PORT_NAMES},
        )
        return self.connection_info

    async def _await_registration(self) -> KernelRegistration:
        """Poll the registration socket and the process until one registration is accepted."""
        km = self._km
        sock = self._reg_socket
        assert sock is not None
        assert self.process is not None
        signer = Signer(km.session.key, km.session.signature_scheme)
        deadline = time.monotonic() + self.handshake_timeout
        rejected: list[str] = []
        while True:
            while sock.poll(0, zmq.POLLIN):
                frames = sock.recv_multipart(zmq.NOBLOCK)
                accepted = self._handle_registration(sock, frames, signer, rejected)
                if accepted is not None:
                    return accepted
            code = self.process.poll()
            if code is not None:
                tail = self._stderr_tail.text(wait=1.0) if self._stderr_tail else "(stderr not captured)"
                raise HandshakeError(
                    f"kernel {self.kernel_spec.display_name or ''!s} ({self.kernel_id}) exited with code {code} "
                    f"before registering on {self._reg_url}"
                    + (f"; rejected: {'; '.join(rejected)}" if rejected else "")
                    + f"\n--- kernel stderr (tail) ---\n{tail.rstrip()}"
                )
            if time.monotonic() >= deadline:
                raise HandshakeError(
                    f"kernel {self.kernel_id} did not register on {self._reg_url} within "
                    f"{self.handshake_timeout:g} s; killed it (pid {self.pid})"
                    + (f"; rejected: {'; '.join(rejected)}" if rejected else "")
                )
            await asyncio.sleep(POLL_INTERVAL)

    def _handle_registration(
        self, sock: zmq.Socket[bytes], frames: list[bytes], signer: Signer, rejected: list[str]
    ) -> KernelRegistration | None:
        """Verify one registration; reply; return it if accepted, else record why not."""
        try:
            prefix, reg = parse_registration_frames(frames, signer)
        except ProtocolError as exc:
            # Badly signed or malformed: drop without a reply (we cannot sign
            # anything the sender could trust), keep waiting.
            log.warning("kernel %s: dropped a registration: %s", self.kernel_id, exc)
            rejected.append(str(exc))
            return None
        wrong_id = reg.kernel_id is not None and reg.kernel_id != self.kernel_id
        missing_id = reg.dialect is Dialect.J and reg.kernel_id is None
        if wrong_id or missing_id:
            why = f"kernel_id {reg.kernel_id!r} is not this launch's {self.kernel_id!r}"
            log.warning("kernel %s: refused a registration: %s", self.kernel_id, why)
            rejected.append(why)
            self._reply(sock, prefix, reg, signer, error=why)
            return None
        self._reply(sock, prefix, reg, signer, error=None)
        return reg

    @staticmethod
    def _reply(
        sock: zmq.Socket[bytes], prefix: list[bytes], reg: KernelRegistration, signer: Signer, *, error: str | None
    ) -> None:
        if reg.dialect is Dialect.J:
            body = build_ack_j(signer, error=error)
        else:
            body = build_reply_p(signer, reg.request_header, error=error)
        try:
            sock.send_multipart([*prefix, *body], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.warning("could not send the registration reply: %s", exc)

    async def _abandon_process(self) -> None:
        """Kill the half-started kernel's process group, reap it, forget it."""
        if self.process is None:
            return
        if self.process.poll() is None:
            await self.kill()
        try:
            await asyncio.wait_for(asyncio.to_thread(self.process.wait), timeout=5.0)
        except TimeoutError:
            log.warning("kernel %s (pid %s) did not die after SIGKILL", self.kernel_id, self.pid)
        self.process = None
        self._remove_registration_file()

    # -- resources -------------------------------------------------------------

    def _close_registration(self) -> None:
        if self._reg_socket is not None:
            self._reg_socket.close(linger=0)
            self._reg_socket = None
        if self._zmq_context is not None:
            self._zmq_context.term()
            self._zmq_context = None

    async def _close_registration_async(self) -> None:
        """Close the ROUTER letting a queued reply leave (linger 1 s, off the event loop)."""
        sock, ctx = self._reg_socket, self._zmq_context
        self._reg_socket = self._zmq_context = None
        if sock is not None:
            sock.close(linger=1000)
        if ctx is not None:
            await asyncio.to_thread(ctx.term)

    def _remove_registration_file(self) -> None:
        if self._registration_path is not None:
            try:
                self._registration_path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("cannot remove registration file %s: %s", self._registration_path, exc)
            self._registration_path = None

    async def cleanup(self, restart: bool = False) -> None:
        """LocalProvisioner.cleanup plus: remove the registration file, close a leftover socket."""
        self._close_registration()
        self._remove_registration_file()
        await super().cleanup(restart=restart)
