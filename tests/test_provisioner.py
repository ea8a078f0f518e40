"""HandshakeProvisioner through jupyter_client's real KernelManager (tier 3/4).

Real kernels: xeus-python 0.19 from PyPI (dialect J, JEP 66), ipykernel
(classic; kernelspec says 5.5 and must not get the handshake), trikernel
(mode C; waits on cli.py), and a small in-test "mini kernel" that binds five
sockets and registers with trikernel.server.registration.register (to check the
launcher rules: 0600 file at its own path, both dialects, refusal of a wrong
kernel_id, dropping a bad signature). Loopback only.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import wait_ready
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.provisioning import LocalProvisioner
from jupyter_client.provisioning.factory import KernelProvisionerFactory

from trikernel.errors import HandshakeError
from trikernel.launch.provisioner import HandshakeProvisioner, wants_handshake, write_registration_file
from trikernel.protocol.handshake import PORT_NAMES

if TYPE_CHECKING:
    from collections.abc import Iterator

REPO = Path(__file__).resolve().parents[1]
EP_GROUP = "jupyter_client.kernel_provisioners"
EP_NAME = "trikernel-handshake"


@pytest.fixture(scope="module", autouse=True)
def provisioner_entry_point(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Make ``trikernel-handshake`` discoverable before pyproject.toml declares it.

    If the real entry point is installed this does nothing; otherwise it
    puts a throwaway dist-info carrying the entry point on sys.path.
    """
    if entry_points(group=EP_GROUP, name=EP_NAME):
        yield
        return
    root = tmp_path_factory.mktemp("ep")
    dist = root / "trikernel_test_entrypoint-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: trikernel-test-entrypoint\nVersion: 0.0\n")
    entry = "trikernel.launch.provisioner:HandshakeProvisioner"
    (dist / "entry_points.txt").write_text(f"[{EP_GROUP}]\n{EP_NAME} = {entry}\n")
    sys.path.insert(0, str(root))
    try:
        yield
    finally:
        sys.path.remove(str(root))


def kernel_env() -> dict[str, str]:
    """Kernelspec env: make the in-tree trikernel importable in the kernel process."""
    parts = [str(REPO), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in parts if p)}


def make_spec(
    tmp_path: Path,
    name: str,
    argv: list[str],
    *,
    protocol: str | None = "5.6",
    provisioner: bool = True,
    config: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
) -> KernelSpecManager:
    kernels = tmp_path / "kernels"
    (kernels / name).mkdir(parents=True, exist_ok=True)
    spec: dict[str, Any] = {
        "argv": argv,
        "display_name": name,
        "language": "python",
        "env": kernel_env(),
        "metadata": dict(metadata or {}),
    }
    if protocol is not None:
        spec["kernel_protocol_version"] = protocol
    if provisioner:
        cfg = {"registration_dir": str(tmp_path / "reg"), **(config or {})}
        spec["metadata"]["kernel_provisioner"] = {"provisioner_name": EP_NAME, "config": cfg}
    (kernels / name / "kernel.json").write_text(json.dumps(spec))
    return KernelSpecManager(kernel_dirs=[str(kernels)])


def make_km(tmp_path: Path, name: str, ksm: KernelSpecManager) -> KernelManager:
    return KernelManager(
        kernel_name=name, kernel_spec_manager=ksm, connection_file=str(tmp_path / f"kernel-{name}.json")
    )


def run_code(km: KernelManager, code: str) -> str:
    """Execute ``code``; return the text/plain of its execute_result."""
    kc = km.client()
    kc.start_channels()
    try:
        wait_ready(km, kc)
        results: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "execute_result":
                results.append(msg["content"]["data"]["text/plain"])

        reply = kc.execute_interactive(code, timeout=60, output_hook=hook)
        assert reply["content"]["status"] == "ok", reply["content"]
        assert results, "no execute_result"
        return results[-1]
    finally:
        kc.stop_channels()


def ports_of(km: KernelManager) -> dict[str, int]:
    info = km.get_connection_info()
    return {name: info[name] for name in PORT_NAMES}  # type: ignore[literal-required]


# ---------------------------------------------------------------------------
# Pure parts
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "metadata", "override", "expected"),
    [
        ("5.5", {}, None, False),  # ipykernel: no handshake
        ("5.6", {}, None, True),
        ("5.10", {}, None, True),  # numeric, not string, comparison
        ("6", {}, None, True),
        ("", {}, None, False),
        ("banana", {}, None, False),
        ("5.3", {"trikernel": {"handshake": True}}, None, True),
        ("5.6", {"trikernel": {"handshake": False}}, None, False),
        ("5.6", {}, False, False),
        ("5.0", {}, True, True),
    ],
)
def test_wants_handshake(version: str, metadata: dict[str, Any], override: bool | None, expected: bool) -> None:
    assert wants_handshake(version, metadata, override=override) is expected


def test_registration_file_is_0600(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "registration.json"
    write_registration_file(path, {"registration_port": 1, "key": "secret"})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["key"] == "secret"
    assert [p.name for p in path.parent.iterdir()] == ["registration.json"]


def test_provisioner_is_a_local_provisioner() -> None:
    assert issubclass(HandshakeProvisioner, LocalProvisioner)
    assert KernelProvisionerFactory.instance()._check_availability(EP_NAME)


# ---------------------------------------------------------------------------
# xeus-python 0.19 (dialect J) and ipykernel (classic)
# ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_xeus_python_starts_via_handshake_and_restarts(tmp_path: Path) -> None:
    pytest.importorskip("xpython_launcher", reason="pip install xeus-python==0.19.0")
    argv = [sys.executable, "-m", "xpython_launcher", "-f", "{connection_file}"]
    # xeus 6 reads registration_port as a JSON string
    ksm = make_spec(tmp_path, "xpy", argv, config={"registration_port_format": "str"})
    km = make_km(tmp_path, "xpy", ksm)
    km.start_kernel()
    try:
        assert isinstance(km.provisioner, HandshakeProvisioner)
        assert km.provisioner._use_handshake
        assert run_code(km, "1+1") == "2"
        first_ports, first_key = ports_of(km), km.session.key
        # the real connection file has the reported ports
        written = json.loads(Path(km.connection_file).read_text())
        assert {k: written[k] for k in PORT_NAMES} == first_ports

        km.restart_kernel(now=True)
        assert km.session.key == first_key
        assert ports_of(km) != first_ports
        written = json.loads(Path(km.connection_file).read_text())
        assert {k: written[k] for k in PORT_NAMES} == ports_of(km)
        assert run_code(km, "2+3") == "5"
    finally:
        km.shutdown_kernel(now=True)
    assert list((tmp_path / "reg").iterdir()) == []  # registration file removed


@pytest.mark.timeout(120)
def test_ipykernel_starts_classic_through_provisioner(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    ksm = make_spec(tmp_path, "ipy", argv, protocol="5.5")
    km = make_km(tmp_path, "ipy", ksm)
    km.start_kernel()
    try:
        assert isinstance(km.provisioner, HandshakeProvisioner)
        assert not km.provisioner._use_handshake
        assert km.provisioner.ports_cached  # LocalProvisioner's port cache path
        assert run_code(km, "1+1") == "2"
    finally:
        km.shutdown_kernel(now=True)
    assert not (tmp_path / "reg").exists()


@pytest.mark.timeout(120)
def test_default_provisioner_name_selects_it_globally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """JUPYTER_DEFAULT_PROVISIONER_NAME / KernelProvisionerFactory.default_provisioner_name."""
    factory = KernelProvisionerFactory.instance()
    monkeypatch.setattr(factory, "default_provisioner_name", EP_NAME)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    ksm = make_spec(tmp_path, "ipy2", argv, protocol=None, provisioner=False)
    km = make_km(tmp_path, "ipy2", ksm)
    km.start_kernel()
    try:
        assert isinstance(km.provisioner, HandshakeProvisioner)
        assert not km.provisioner._use_handshake
        assert run_code(km, "1+1") == "2"
    finally:
        km.shutdown_kernel(now=True)


# ---------------------------------------------------------------------------
# Failure handling: exit at once, silent kernel
# ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_kernel_that_exits_at_once_fails_fast_with_code_and_stderr(tmp_path: Path) -> None:
    code = "import sys; sys.stderr.write('boom: cannot start\\n'); sys.exit(3)"
    # a handshake timeout longer than this test's: failing at all is failing at once
    ksm = make_spec(
        tmp_path, "dies", [sys.executable, "-c", code, "{connection_file}"], config={"handshake_timeout": 600}
    )
    km = make_km(tmp_path, "dies", ksm)
    with pytest.raises(HandshakeError) as info:
        km.start_kernel()
    msg = str(info.value)
    assert "exited with code 3" in msg
    assert "boom: cannot start" in msg
    assert km.provisioner is not None
    assert not km.provisioner.has_process
    assert list((tmp_path / "reg").iterdir()) == []


@pytest.mark.timeout(60)
def test_silent_kernel_is_killed_after_timeout(tmp_path: Path) -> None:
    ksm = make_spec(
        tmp_path,
        "silent",
        [sys.executable, "-c", "import time; time.sleep(600)", "{connection_file}"],
        config={"handshake_timeout": 1.5},
    )
    km = make_km(tmp_path, "silent", ksm)
    with pytest.raises(HandshakeError, match="did not register") as info:  # the pytest timeout bounds a hang
        km.start_kernel()
    assert "killed" in str(info.value)
    prov = km.provisioner
    assert isinstance(prov, HandshakeProvisioner)
    assert not prov.has_process
    pid = prov.pid
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# ---------------------------------------------------------------------------
# Launcher rules with a mini kernel that uses trikernel.server.registration.register
# ---------------------------------------------------------------------------

MINI_KERNEL = textwrap.dedent(
    """
    import json, os, stat, sys, time
    import zmq
    from trikernel.errors import HandshakeError
    from trikernel.protocol.handshake import PORT_NAMES, parse_registration
    from trikernel.server.registration import register
    from trikernel.protocol.wire import Signer

    args = sys.argv[1:]
    path, mode, report = args[args.index("-f") + 1], args[args.index("--mode") + 1], args[args.index("--report") + 1]
    d = json.load(open(path))
    original = dict(d)
    if mode == "p":  # speak ark/kallichore's dialect to the launcher
        d.pop("kernel_id"); d.pop("registration_ip")
    elif mode == "wrong_id":
        d["kernel_id"] = "a-late-kernel-from-another-launch"
    elif mode == "bad_key":
        d["key"] = "not-the-key"
    info = parse_registration(d)
    ctx = zmq.Context()
    socks, ports = [], {}
    for name in PORT_NAMES:
        s = ctx.socket(zmq.ROUTER)
        ports[name] = s.bind_to_random_port("tcp://" + info.bind_ip)
        socks.append(s)
    with open(report, "w") as f:
        json.dump({"ports": ports, "mode": stat.S_IMODE(os.stat(path).st_mode), "path": path,
                   "file": original, "dialect": info.dialect.value}, f)
    try:
        register(info, ports, Signer(info.security.key, info.security.signature_scheme), timeout=1.5)
    except HandshakeError as exc:
        print("mini kernel: handshake failed:", exc, file=sys.stderr, flush=True)
        sys.exit(7)
    time.sleep(600)
    """
)


def mini_kernel_spec(tmp_path: Path, mode: str, **kw: Any) -> tuple[KernelSpecManager, Path]:
    script = tmp_path / "mini_kernel.py"
    script.write_text(MINI_KERNEL)
    report = tmp_path / f"report-{mode}.json"
    argv = [sys.executable, str(script), "-f", "{connection_file}", "--mode", mode, "--report", str(report)]
    return make_spec(tmp_path, f"mini-{mode}", argv, **kw), report


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["j", "p"])
def test_mini_kernel_both_dialects(tmp_path: Path, mode: str) -> None:
    # opt in through metadata instead of kernel_protocol_version
    ksm, report = mini_kernel_spec(tmp_path, mode, protocol="5.3", metadata={"trikernel": {"handshake": True}})
    km = make_km(tmp_path, f"mini-{mode}", ksm)
    km.start_kernel()
    try:
        seen = json.loads(report.read_text())
        assert seen["dialect"] == mode.upper()
        assert ports_of(km) == seen["ports"]
        assert seen["mode"] == 0o600
        assert Path(seen["path"]).resolve() != Path(km.connection_file).resolve()
        reg = seen["file"]
        assert reg["kernel_id"] == km.kernel_id
        assert isinstance(reg["registration_port"], int)
        assert reg["key"] == km.session.key.decode()
        assert "shell_port" not in reg
        assert isinstance(km.get_connection_info()["key"], bytes)
    finally:
        km.shutdown_kernel(now=True)


@pytest.mark.timeout(60)
def test_wrong_kernel_id_is_refused(tmp_path: Path) -> None:
    ksm, _ = mini_kernel_spec(tmp_path, "wrong_id")
    km = make_km(tmp_path, "mini-wrong_id", ksm)
    with pytest.raises(HandshakeError) as info:
        km.start_kernel()
    msg = str(info.value)
    assert "exited with code 7" in msg
    assert "a-late-kernel-from-another-launch" in msg  # why we refused
    assert "refused" in msg  # the kernel's own stderr tail


@pytest.mark.timeout(60)
def test_bad_signature_is_dropped(tmp_path: Path) -> None:
    ksm, _ = mini_kernel_spec(tmp_path, "bad_key")
    km = make_km(tmp_path, "mini-bad_key", ksm)
    with pytest.raises(HandshakeError) as info:
        km.start_kernel()
    msg = str(info.value)
    assert "exited with code 7" in msg
    assert "signature" in msg
    assert "no acknowledgement" in msg


# ---------------------------------------------------------------------------
# trikernel itself (mode C) -- waits on cli.py
# ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_trikernel_via_provisioner_runs_code_and_restarts(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "trikernel", "-f", "{connection_file}"]
    ksm = make_spec(tmp_path, "tri", argv)
    km = make_km(tmp_path, "tri", ksm)
    km.start_kernel()
    try:
        assert isinstance(km.provisioner, HandshakeProvisioner)
        assert km.provisioner._use_handshake
        assert run_code(km, "1+1") == "2"
        before = ports_of(km)
        km.restart_kernel(now=True)
        assert ports_of(km) != before
        assert run_code(km, "40+2") == "42"
    finally:
        km.shutdown_kernel(now=True)
    assert list((tmp_path / "reg").iterdir()) == []


def test_no_stray_registration_files_in_tmp(tmp_path: Path) -> None:
    """write_registration_file leaves no temporary file behind on success."""
    target = tmp_path / "r.json"
    write_registration_file(target, {"a": 1})
    write_registration_file(target, {"a": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


@pytest.mark.timeout(120)
def test_trikernel_via_provisioner_with_curve_encryption(tmp_path: Path) -> None:
    """Curve keys travel in the registration file; jupyter_client 8.10 transport_encryption."""
    import zmq

    if not zmq.has("curve"):
        pytest.skip("libzmq built without CURVE")
    argv = [sys.executable, "-m", "trikernel", "-f", "{connection_file}"]
    ksm = make_spec(tmp_path, "tri-curve", argv, metadata={"supported_encryption": ["curve"]})
    km = KernelManager(
        kernel_name="tri-curve",
        kernel_spec_manager=ksm,
        connection_file=str(tmp_path / "kernel-tri-curve.json"),
        transport_encryption="required",
    )
    km.start_kernel()
    try:
        assert isinstance(km.provisioner, HandshakeProvisioner)
        assert km.provisioner._use_handshake
        assert km.get_connection_info().get("curve_publickey")
        assert run_code(km, "1+1") == "2"
    finally:
        km.shutdown_kernel(now=True)
