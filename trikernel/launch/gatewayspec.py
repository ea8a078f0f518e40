"""Kernelspecs for gateway_provisioners (GP) and Enterprise Gateway (EG): ``python -m trikernel install --gateway ...``.

Shapes (GP 0.5.0 ``kernel-specs/ssh_python`` and ``container_python``; EG
3.3.0 ``etc/kernelspecs/python_distributed``):

- ``distributed``: ``argv`` runs ``python -m trikernel gateway-launch`` with
  the launcher placeholders on the host the server picks;
  ``metadata.kernel_provisioner`` names GP's ``distributed-provisioner``
  with ``config.remote_hosts`` (a list). ``--process-proxy`` writes EG's
  form instead: ``metadata.process_proxy.class_name`` =
  ``DistributedProcessProxy`` with ``config.remote_hosts`` as one
  comma-separated string (as EG reads it).
- ``kubernetes``, ``docker``, ``docker-swarm``: ``argv`` runs GP's own
  ``launch_kubernetes.py`` / ``launch_docker.py`` (copied from the installed
  gateway_provisioners into the kernelspec's ``scripts/``) on the server;
  that creates a pod / container from ``config.image_name``, whose CMD
  (``containers/bootstrap-kernel.sh``) starts trikernel from the
  environment.

Socket options given to ``install`` go into the spec's ``env`` as
``TRIKERNEL_SOCKET_OPTIONS`` for every kind: GP exports the spec's env
quoted over SSH (argv it joins unquoted) and copies the launcher's
environment into pods and containers.

Every spec declares ``interrupt_mode: "signal"`` (the server then interrupts
through the comm port) and ``metadata.supported_encryption: ["curve"]`` with
a ``{transport_encryption}`` placeholder in ``argv`` (GP's condition for
CurveZMQ; EG 3.3.0 leaves the placeholder alone and gateway-launch reads it
as "off").

Runs on: the main thread of ``python -m trikernel install --gateway``, at
install time (no kernel runs; no trio).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trikernel.errors import ConfigError

if TYPE_CHECKING:
    import argparse

    from trikernel.server.sockopts import SocketOptions

#: --gateway value -> GP provisioner name.
PROVISIONERS = {
    "distributed": "distributed-provisioner",
    "kubernetes": "kubernetes-provisioner",
    "docker": "docker-provisioner",
    "docker-swarm": "docker-swarm-provisioner",
}
#: EG's process proxy for ``--gateway distributed --process-proxy``.
EG_DISTRIBUTED = "enterprise_gateway.services.processproxies.distributed.DistributedProcessProxy"
#: Container gateways -> (GP launcher directory under kernel-launchers/, script).
CONTAINER_LAUNCHERS = {
    "kubernetes": ("kubernetes", "launch_kubernetes.py"),
    "docker": ("docker", "launch_docker.py"),
    "docker-swarm": ("docker", "launch_docker.py"),
}
DISPLAY_NAMES = {
    "distributed": "Python 3 (trikernel, remote hosts)",
    "kubernetes": "Python 3 (trikernel on Kubernetes)",
    "docker": "Python 3 (trikernel on Docker)",
    "docker-swarm": "Python 3 (trikernel on Docker Swarm)",
}
#: The launcher placeholders, in GP's order; the server substitutes them.
LAUNCHER_ARGV = (
    "--kernel-id",
    "{kernel_id}",
    "--port-range",
    "{port_range}",
    "--response-address",
    "{response_address}",
    "--public-key",
    "{public_key}",
    "--transport-encryption",
    "{transport_encryption}",
)


@dataclass(frozen=True)
class GatewaySpec:
    """What ``install --gateway`` was asked for.

    - ``gateway``: a key of :data:`PROVISIONERS`.
    - ``process_proxy``: EG's ``metadata.process_proxy`` form (distributed only).
    - ``remote_hosts``: host names for ``distributed`` (empty: the server's default).
    - ``port_range``: ``"L..U"`` for the provisioner config (None: the server's default).
    - ``launch_timeout``: seconds the server waits for the payload (None: its default).
    - ``image_name``: the kernel image (containers; required there).
    - ``python``: the interpreter in ``argv`` (on the remote host for
      ``distributed``, on the server for containers).
    - ``ip``: ``gateway-launch --ip`` (distributed; None: all interfaces).
    - ``socket_options``: ``--socket-option`` specs to bake in.
    """

    gateway: str
    process_proxy: bool = False
    remote_hosts: tuple[str, ...] = ()
    port_range: str | None = None
    launch_timeout: int | None = None
    image_name: str | None = None
    python: str = field(default_factory=lambda: sys.executable)
    ip: str | None = None
    socket_options: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.gateway not in PROVISIONERS:
            raise ConfigError(f"--gateway: expected one of {', '.join(PROVISIONERS)}, got {self.gateway!r}")
        if self.process_proxy and self.gateway != "distributed":
            raise ConfigError(
                "--process-proxy: only with --gateway distributed; for Enterprise Gateway's container process "
                "proxies use EG's own kernelspec with image_name set to the trikernel image (docs/gateway.md)"
            )
        if self.gateway in CONTAINER_LAUNCHERS and not self.image_name:
            raise ConfigError(f"--image-name: required with --gateway {self.gateway}")
        if self.remote_hosts and self.gateway != "distributed":
            raise ConfigError(f"--remote-hosts: only with --gateway distributed, not {self.gateway}")
        if self.port_range is not None:
            from trikernel.protocol.gateway import parse_port_range

            parse_port_range(self.port_range)
        if self.launch_timeout is not None and self.launch_timeout <= 0:
            raise ConfigError(f"--launch-timeout: must be > 0 seconds, got {self.launch_timeout}")


def kernel_json(
    spec: GatewaySpec,
    *,
    display_name: str | None = None,
    interrupt_mode: str = "signal",
    launcher_script: str | None = None,
) -> dict[str, Any]:
    """The kernel.json dict for ``spec``.

    ``launcher_script``: absolute path of GP's container launcher (containers only).
    """
    from trikernel.launch import kernelspec

    base = kernelspec.kernel_json(
        python=spec.python,
        display_name=display_name or DISPLAY_NAMES[spec.gateway],
        interrupt_mode=interrupt_mode,
    )
    # Socket options travel in the environment, never in argv: over SSH GP
    # joins argv into a shell command without quoting (``*.LINGER=0`` would
    # be a glob there), while it exports the spec's env quoted; the
    # container launchers copy the environment into the pod or container.
    env: dict[str, str] = {}
    if spec.socket_options:
        env["TRIKERNEL_SOCKET_OPTIONS"] = " ".join(spec.socket_options)
    if spec.gateway in CONTAINER_LAUNCHERS:
        if launcher_script is None:
            raise ValueError("launcher_script is required for container gateways")
        argv = [spec.python, launcher_script, *LAUNCHER_ARGV]
    else:
        argv = [spec.python, "-m", "trikernel", "gateway-launch", *LAUNCHER_ARGV]
        if spec.ip:
            argv += ["--ip", spec.ip]
    config: dict[str, Any] = {}
    if spec.image_name:
        config["image_name"] = spec.image_name
    if spec.remote_hosts:
        config["remote_hosts"] = ",".join(spec.remote_hosts) if spec.process_proxy else list(spec.remote_hosts)
    if spec.port_range is not None:
        config["port_range"] = spec.port_range
    if spec.launch_timeout is not None:
        config["launch_timeout"] = spec.launch_timeout
    metadata = dict(base["metadata"])
    if spec.process_proxy:
        metadata["process_proxy"] = {"class_name": EG_DISTRIBUTED, "config": config}
    else:
        metadata["kernel_provisioner"] = {"provisioner_name": PROVISIONERS[spec.gateway], "config": config}
    return {**base, "argv": argv, "metadata": metadata, "env": env}


def gp_launcher_dir(gateway: str) -> str:
    """GP's launcher scripts directory for a container ``gateway``; ConfigError if GP is missing."""
    import importlib.util

    found = importlib.util.find_spec("gateway_provisioners")
    if found is None or found.origin is None:
        raise ConfigError(
            f"--gateway {gateway}: needs gateway_provisioners installed here (its "
            f"{CONTAINER_LAUNCHERS[gateway][1]} runs on the server): pip install gateway_provisioners"
        )
    path = os.path.join(os.path.dirname(found.origin), "kernel-launchers", CONTAINER_LAUNCHERS[gateway][0], "scripts")
    if not os.path.isfile(os.path.join(path, CONTAINER_LAUNCHERS[gateway][1])):
        raise ConfigError(f"--gateway {gateway}: {CONTAINER_LAUNCHERS[gateway][1]} not found under {path}")
    return path


def install(
    spec: GatewaySpec,
    *,
    user: bool = False,
    prefix: str | None = None,
    name: str,
    display_name: str | None = None,
    interrupt_mode: str = "signal",
) -> str:
    """Write the kernelspec through jupyter_client's KernelSpecManager; returns its directory.

    Container gateways also get GP's launcher scripts in ``scripts/``, and
    ``argv`` names them at their installed path. Raises ConfigError (GP
    missing for a container gateway).
    """
    from jupyter_client.kernelspec import KernelSpecManager

    from trikernel.launch import kernelspec

    scripts = gp_launcher_dir(spec.gateway) if spec.gateway in CONTAINER_LAUNCHERS else None
    with tempfile.TemporaryDirectory() as td:
        path = os.path.join(td, name)
        os.makedirs(path)
        for logo in ("logo-32x32.png", "logo-64x64.png", "logo-svg.svg"):
            src = os.path.join(kernelspec.RESOURCES, logo)
            if os.path.exists(src):
                shutil.copy(src, path)
        if scripts is not None:
            shutil.copytree(scripts, os.path.join(path, "scripts"), ignore=shutil.ignore_patterns("__pycache__"))
        with open(os.path.join(path, "kernel.json"), "w") as f:
            json.dump({}, f)  # written below, once the destination is known
        dest = str(KernelSpecManager().install_kernel_spec(path, name, user=user, prefix=prefix))
    script = os.path.join(dest, "scripts", CONTAINER_LAUNCHERS[spec.gateway][1]) if scripts is not None else None
    data = kernel_json(spec, display_name=display_name, interrupt_mode=interrupt_mode, launcher_script=script)
    with open(os.path.join(dest, "kernel.json"), "w") as f:
        json.dump(data, f, indent=1)
    return dest


# ---------------------------------------------------------------------------
# python -m trikernel install --gateway ... (cli.py calls these)
# ---------------------------------------------------------------------------


def add_install_arguments(p: argparse.ArgumentParser) -> None:
    """The ``install`` options for gateway kernelspecs."""
    g = p.add_argument_group("gateway kernelspecs (gateway_provisioners / Enterprise Gateway; docs/gateway.md)")
    g.add_argument("--gateway", choices=list(PROVISIONERS), help="write a kernelspec for this gateway provisioner")
    g.add_argument(
        "--process-proxy",
        action="store_true",
        help="Enterprise Gateway's metadata.process_proxy form instead of GP's kernel_provisioner (distributed)",
    )
    g.add_argument(
        "--remote-hosts",
        nargs="+",
        metavar="HOST",
        help="hosts the kernel may run on (distributed; also comma-separated)",
    )
    g.add_argument("--port-range", metavar="L..U", help="ports the kernel may bind (e.g. 40000..41000)")
    g.add_argument("--launch-timeout", type=int, metavar="SECONDS", help="seconds the server waits for the kernel")
    g.add_argument("--image-name", metavar="IMAGE", help="kernel image (kubernetes, docker, docker-swarm)")
    g.add_argument(
        "--python",
        metavar="PATH",
        help="interpreter named in argv (default: this one; for distributed it runs on the remote host)",
    )
    g.add_argument("--ip", metavar="ADDR", help="address the kernel binds (distributed; default all interfaces)")


def spec_from_args(args: argparse.Namespace, socket_options: SocketOptions) -> GatewaySpec | None:
    """The :class:`GatewaySpec` of the parsed ``install`` options, or None without ``--gateway``.

    ``socket_options``: the resolved options (their non-default values are baked in).
    Raises ConfigError naming the option for a bad value, for ``--handshake``
    with ``--gateway``, or for a gateway-only option without ``--gateway``.
    """
    if args.gateway is None:
        for dest in ("process_proxy", "remote_hosts", "port_range", "launch_timeout", "image_name", "python", "ip"):
            if getattr(args, dest):
                raise ConfigError(f"--{dest.replace('_', '-')}: only with --gateway")
        return None
    if args.handshake:
        raise ConfigError("--handshake: not with --gateway (the gateway provisioner starts the kernel)")
    hosts = [h.strip() for entry in args.remote_hosts or () for h in entry.split(",")]
    return GatewaySpec(
        gateway=args.gateway,
        process_proxy=args.process_proxy,
        remote_hosts=tuple(h for h in hosts if h),
        port_range=args.port_range,
        launch_timeout=args.launch_timeout,
        image_name=args.image_name,
        python=args.python or sys.executable,
        ip=args.ip,
        socket_options=tuple(socket_options.as_argv()[1::2]),  # ["--socket-option", SPEC, ...]
    )


def default_name(gateway: str) -> str:
    """The kernelspec name when ``--name`` is not given: ``trikernel-<gateway>``."""
    return f"trikernel-{gateway}"
