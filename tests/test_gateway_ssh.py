"""trikernel over SSH on another host address (tier 4): GP's DistributedProvisioner
launches the kernel through sshd inside a second network namespace.

The "remote host" is a network namespace joined to this one by a veth pair
(10.x.y.1 here, 10.x.y.2 there): the kernel binds, and is reached, on an
address of another network stack, GP launches it with paramiko and ``nohup``
(not as its own child), and lifecycle goes through the comm port only. It
shares this machine's filesystem and process table, so the kernelspec's
interpreter path works and psutil can check that nothing is left behind.

Needs root, ``ip netns`` (CAP_SYS_ADMIN), ``sshd`` and ``ssh-keygen``
(Debian: ``apt-get install openssh-server``); skipped with the reason
otherwise. Nothing outside the test's temporary directory is touched but
the namespace and veth pair (removed at the end) and ``/run/sshd`` (sshd's
privilege-separation directory, created if missing). GP's side runs in a
subprocess, because GP reads ``GP_RESPONSE_IP`` when imported and paramiko
reads ``~/.ssh`` (HOME is the test's directory there).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil
import pytest
from conftest import install_kernelspec

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.timeout(300)

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=check)


@dataclass
class RemoteHost:
    netns: str
    local_ip: str  # this side of the veth pair (GP's response address)
    remote_ip: str  # the namespace's side (where sshd and the kernel run)
    home: Path  # HOME for GP's side: ~/.ssh with the client key and known_hosts


@pytest.fixture(scope="module")
def remote_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteHost]:
    if os.geteuid() != 0:
        pytest.skip("SSH/netns test needs root (ip netns, sshd)")
    for tool, path in (("ip", shutil.which("ip")), ("sshd", SSHD), ("ssh-keygen", shutil.which("ssh-keygen"))):
        if path is None:
            pytest.skip(f"SSH/netns test needs {tool} (Debian: apt-get install iproute2 openssh-server)")
    tag = os.getpid() % 100000
    netns, host_if, ns_if = f"tk-gw-{tag}", f"tkh{tag}", f"tkn{tag}"
    octet = 200 + tag % 50
    local_ip, remote_ip = f"10.{octet}.{tag % 250}.1", f"10.{octet}.{tag % 250}.2"
    if f"10.{octet}.{tag % 250}." in _run("ip", "-4", "addr").stdout:
        pytest.skip(f"10.{octet}.{tag % 250}.0/30 is in use on this machine")
    r = _run("ip", "netns", "add", netns, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot create a network namespace here: {r.stderr.strip()}")
    tmp = tmp_path_factory.mktemp("ssh")
    sshd = None
    try:
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _run("ip", "link", "set", ns_if, "netns", netns)
        _run("ip", "addr", "add", f"{local_ip}/30", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        for cmd in (("ip", "addr", "add", f"{remote_ip}/30", "dev", ns_if), ("ip", "link", "set", ns_if, "up"),
                    ("ip", "link", "set", "lo", "up")):  # fmt: skip
            _run("ip", "netns", "exec", netns, *cmd)

        home = tmp / "home"
        (home / ".ssh").mkdir(parents=True, mode=0o700)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "host_key"))
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh" / "id_ed25519"))
        shutil.copy(home / ".ssh" / "id_ed25519.pub", tmp / "authorized_keys")
        host_pub = (tmp / "host_key.pub").read_text().split()
        (home / ".ssh" / "known_hosts").write_text(f"{remote_ip} {host_pub[0]} {host_pub[1]}\n")
        (tmp / "sshd_config").write_text(
            textwrap.dedent(f"""\
                Port 22
                ListenAddress {remote_ip}
                HostKey {tmp}/host_key
                PidFile {tmp}/sshd.pid
                AuthorizedKeysFile {tmp}/authorized_keys
                StrictModes no
                UsePAM no
                PasswordAuthentication no
                KbdInteractiveAuthentication no
                PubkeyAuthentication yes
                PermitRootLogin prohibit-password
                LogLevel VERBOSE
                """)
        )
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        assert SSHD is not None
        sshd = subprocess.Popen(
            ["ip", "netns", "exec", netns, SSHD, "-D", "-e", "-f", str(tmp / "sshd_config")],
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        assert sshd.stderr is not None
        while time.monotonic() < deadline:
            line = sshd.stderr.readline()
            if not line:
                pytest.fail(f"sshd exited: {sshd.wait()}")
            if "Server listening on" in line:
                break
        yield RemoteHost(netns, local_ip, remote_ip, home)
    finally:
        if sshd is not None:
            sshd.terminate()
            sshd.wait(timeout=30)
        # anything still running in the namespace is ours (a kernel the test failed to stop)
        for pid in _run("ip", "netns", "pids", netns, check=False).stdout.split():
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(int(pid)).kill()
        _run("ip", "netns", "del", netns, check=False)  # removes the veth pair too


DRIVER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    import psutil
    from jupyter_client import AsyncKernelManager

    async def main():
        km = AsyncKernelManager(kernel_name="tk-ssh")
        t0 = time.monotonic()
        await km.start_kernel()
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=60)
        out = {"start_s": time.monotonic() - t0, "assigned_ip": km.provisioner.assigned_ip, "ip": km.ip,
               "local_proc": km.provisioner.local_proc is not None, "pid": km.provisioner.pid,
               "comm": [km.provisioner.comm_ip, km.provisioner.comm_port]}
        code = "import os, socket; print(json.dumps([os.getpid(), [n for _, n in socket.if_nameindex()]]))"
        def hook(m):
            if m["msg_type"] == "stream":
                out.setdefault("cell", m["content"]["text"])
        r = await kc.execute_interactive("import json\\n" + code, timeout=30, output_hook=hook)
        out["cell_status"] = r["content"]["status"]
        msg_id = kc.execute("import time\\nprint('STARTED', flush=True)\\ntime.sleep(60)")
        while True:  # the cell is running once it has printed
            m = await kc.get_iopub_msg(timeout=30)
            if m["parent_header"].get("msg_id") == msg_id and "STARTED" in m["content"].get("text", ""):
                break
        t1 = time.monotonic()
        await km.interrupt_kernel()
        while True:
            m = await kc.get_shell_msg(timeout=30)
            if m["parent_header"].get("msg_id") == msg_id:
                break
        out["interrupt"] = [m["content"].get("ename"), time.monotonic() - t1]
        kc.stop_channels()
        t2 = time.monotonic()
        await km.shutdown_kernel()
        out["shutdown_s"] = time.monotonic() - t2
        out["pid_gone"] = not psutil.pid_exists(out["pid"]) or psutil.Process(out["pid"]).status() == "zombie"
        print("RESULT " + json.dumps(out), flush=True)

    asyncio.run(main())
    """
)


def test_ssh_launch_into_another_network_namespace(remote_host: RemoteHost, tmp_path: Path) -> None:
    jp = install_kernelspec(
        tmp_path / "spec", "tk-ssh", "--gateway", "distributed", "--remote-hosts", remote_host.remote_ip,
        "--launch-timeout", "60",
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SSH_", "GP_"))}
    env.update(
        HOME=str(remote_host.home), JUPYTER_PATH=jp, GP_RESPONSE_IP=remote_host.local_ip,
        GP_KERNEL_LOG_DIR=str(tmp_path), KERNEL_USERNAME="trikernel-test",
    )  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-c", DRIVER], env=env, capture_output=True, text=True, timeout=240, check=False
    )
    logs = "\n".join(p.read_text()[-2000:] for p in tmp_path.glob("kernel-*.log"))
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0, f"driver failed:\n{r.stderr[-4000:]}\nkernel log:\n{logs}"
    assert lines, f"driver printed no result:\n{r.stdout[-2000:]}"
    out = json.loads(lines[0][len("RESULT ") :])

    assert out["assigned_ip"] == remote_host.remote_ip
    assert out["ip"] == remote_host.remote_ip  # the client connected to the other network stack
    assert out["comm"] == [remote_host.remote_ip, out["comm"][1]]
    assert out["local_proc"] is False  # launched over SSH (nohup), not as GP's child
    pid, ifnames = json.loads(out["cell"])
    assert pid == out["pid"]
    assert remote_host.netns.startswith("tk-gw-")
    assert any(n.startswith("tkn") for n in ifnames), ifnames  # the kernel runs in the namespace
    assert not any(n.startswith("tkh") for n in ifnames), ifnames
    assert out["cell_status"] == "ok"
    assert out["interrupt"][0] == "KeyboardInterrupt"
    assert out["interrupt"][1] < 1.0, out
    assert out["pid_gone"], out
    left = [int(p) for p in _run("ip", "netns", "pids", remote_host.netns, check=False).stdout.split()]
    others = [p for p in left if psutil.pid_exists(p) and "sshd" not in " ".join(psutil.Process(p).cmdline())]
    assert others == [], "processes other than sshd left in the namespace"
