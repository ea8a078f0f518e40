"""IPython's command line and configuration, as ipykernel takes them (issue 25).

Tier 1: the two-stage command line (user/ipyoptions.py, launch/cli.py): the
tables held as data equal ipykernel's, options are split and checked before
bind, one line per bad option. Tier 3: real kernels whose kernelspecs carry
IPython options or whose profile sets ``c.IPKernelApp.exec_lines``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
from conftest import execute, make_kernelspec, start_kernel, stdout_of, stop_kernel

from trikernel.errors import ConfigError
from trikernel.launch.cli import _parse_run_args
from trikernel.user import ipyoptions

if TYPE_CHECKING:
    import pathlib

# -- tier 1: the tables and stage 1 ----------------------------------------------------


def test_the_tables_held_as_data_are_ipykernels() -> None:
    """Stage 1 runs before IPython may be imported, so ipykernel's aliases and
    flags are held as data; they must be the ones ipykernel builds from the
    installed IPython and jupyter_client."""
    from ipykernel.kernelapp import kernel_aliases, kernel_flags

    assert dict(kernel_aliases) == ipyoptions.ALIASES
    ours = {k: {s: set(t) for s, t in v[0].items()} for k, v in ipyoptions.FLAGS.items()}
    theirs = {k: {s: set(t) for s, t in v[0].items()} for k, v in kernel_flags.items()}
    theirs["trio-loop"] = {}  # ipykernel's trio loop is trikernel's only one: the flag sets nothing
    assert ours == theirs
    from trikernel.user import kernelapp  # stage 2's tables: IPython's own, and the data for the rest

    assert kernelapp._aliases() == dict(kernel_aliases)
    assert set(kernelapp._flags()) == set(kernel_flags)


def test_trikernel_options_and_ipython_options_are_split() -> None:
    args, config, ipython = _parse_run_args(
        [
            "-f",
            "k.json",
            "--HistoryManager.hist_file",
            ":memory:",
            "--iopub-capacity",
            "50",
            "--InteractiveShell.colors=nocolor",
            "--matplotlib",
            "--debug",
        ]
    )
    assert args.connection_file == "k.json"
    assert config.iopub_capacity == 50
    assert ipython == (
        "--HistoryManager.hist_file",
        ":memory:",
        "--InteractiveShell.colors=nocolor",
        "--matplotlib",
        "--debug",
    )
    assert args.log_level == "DEBUG"  # --debug, as ipykernel's


def test_config_is_trikernels_for_toml_and_ipythons_otherwise() -> None:
    args, _config, ipython = _parse_run_args(["-f", "k.json", "--config", "sockets.toml", "--config=extra.py"])
    assert args.config == "sockets.toml"
    assert ipython == ("--BaseIPythonApplication.extra_config_file=extra.py",)


def test_no_prefix_of_a_trikernel_option_is_taken() -> None:
    """ipykernel's ``--iopub 5555`` is no abbreviation of ``--iopub-capacity``:
    it is ipykernel's port option, refused with the reason."""
    with pytest.raises(ConfigError, match=r"--iopub \(IPKernelApp.iopub_port\): ports come from the connection file"):
        _parse_run_args(["-f", "k.json", "--iopub", "5555"])


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--bogus"], "trikernel: unrecognized option --bogus"),
        (["--bogus=1"], "trikernel: unrecognized option --bogus"),
        (["--bogus", "1"], "trikernel: unrecognized option --bogus"),
        (["stray"], "trikernel: unrecognized argument 'stray'"),
        (["--shell=5"], "trikernel: --shell (IPKernelApp.shell_port): ports come from the connection file (-f)"),
        (["--secure"], "trikernel: --Session.*: the session (key, signature scheme, id) comes from the connection"),
        (["--no-stdout"], "trikernel: --IPKernelApp.no_stdout: not offered"),
        (["--log-level", "loud"], "trikernel: argument --log-level: must be one of"),
    ],
)
def test_an_option_neither_trikernels_nor_ipythons_stops_start_up_with_one_line(
    tmp_path: pathlib.Path, args: list[str], line: str
) -> None:
    """Before the fix any IPython option stopped start-up with argparse's
    ``unrecognized arguments``; now only what neither takes does, naming it,
    before anything is bound (the connection file is never read)."""
    p = subprocess.run(
        [sys.executable, "-m", "trikernel", "-f", str(tmp_path / "missing.json"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(line), p.stderr


def test_a_bad_value_stops_start_up_with_one_line_and_exit_1(tmp_path: pathlib.Path) -> None:
    """Values are checked when the shell takes its config (after bind, as in
    ipykernel, which says "Bad config encountered" and exits 1)."""
    conn = tmp_path / "k.json"
    conn.write_text(json.dumps({"ip": "127.0.0.1", "key": "k", "transport": "tcp"}))
    conn.chmod(0o600)  # as jupyter_client writes it: a readable key file is a warning line of its own
    p = subprocess.run(
        [sys.executable, "-m", "trikernel", "-f", str(conn), "--InteractiveShell.cache_size=notanint"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")},
    )
    assert p.returncode == 1, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("trikernel: bad config: The 'cache_size' trait"), p.stderr


# -- tier 3: real kernels ----------------------------------------------------------------


def _kernel(jupyter_path: str, name: str, argv: list[str], ipython_dir: pathlib.Path) -> tuple[Any, Any]:
    make_kernelspec(jupyter_path, name, extra_argv=argv)
    return start_kernel(name, env={**os.environ, "IPYTHONDIR": str(ipython_dir)})


def _values(outputs: list[dict[str, Any]]) -> list[str]:
    return [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "execute_result"]


def test_a_kernelspec_with_ast_node_interactivity_all_shows_both_values(
    jupyter_path: str, tmp_path: pathlib.Path
) -> None:
    km, kc = _kernel(jupyter_path, "tk-interactivity", ["--InteractiveShell.ast_node_interactivity=all"], tmp_path)
    try:
        r, out = execute(kc, "1\n2")
        assert r["content"]["status"] == "ok"
        assert _values(out) == ["1", "2"]
        r, out = execute(kc, "'IPKernelApp' in get_ipython().config")
        assert _values(out) == ["True"]  # how polars, transformers, wandb tell a notebook kernel
    finally:
        stop_kernel(km, kc)


@pytest.mark.parametrize("memory", [True, False])
def test_hist_file_memory_leaves_no_history_file(jupyter_path: str, tmp_path: pathlib.Path, memory: bool) -> None:
    """nbclient's ``--HistoryManager.hist_file=:memory:`` (the control: without
    it, the profile's history database is written)."""
    argv = ["--HistoryManager.hist_file=:memory:"] if memory else []
    km, kc = _kernel(jupyter_path, f"tk-history-{memory}", argv, tmp_path)
    try:
        r, out = execute(kc, "x = 1\nget_ipython().history_manager.hist_file")
        assert r["content"]["status"] == "ok"
    finally:
        stop_kernel(km, kc)
    files = sorted(p.name for p in tmp_path.rglob("history.sqlite*"))
    if memory:
        assert _values(out) == ["':memory:'"]
        assert files == []
    else:
        assert "history.sqlite" in files


def test_exec_lines_of_the_profile_and_its_startup_files_run_before_the_first_cell(
    jupyter_path: str, tmp_path: pathlib.Path
) -> None:
    profile = tmp_path / "profile_default"
    (profile / "startup").mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text("c.IPKernelApp.exec_lines = ['x = 5']\n")
    (profile / "ipython_config.py").write_text("c.InteractiveShell.xmode = 'Minimal'\n")
    (profile / "startup" / "00-first.py").write_text("from_startup = 'ran'\n")
    km, kc = _kernel(jupyter_path, "tk-profile", ["-c", "from_cli = x + 1"], tmp_path)
    try:
        r, out = execute(kc, "x, from_startup, from_cli, get_ipython().InteractiveTB.mode")
        assert r["content"]["status"] == "ok", r["content"]
        assert _values(out) == ["(5, 'ran', 6, 'Minimal')"]
    finally:
        stop_kernel(km, kc)


def test_profile_dir_and_extensions_on_the_command_line(jupyter_path: str, tmp_path: pathlib.Path) -> None:
    """``--profile-dir`` (ipykernel's test_sys_path_profile_dir) and ``--ext``;
    the command line wins over the profile's config file."""
    profile = tmp_path / "elsewhere" / "profile_mine"
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text("c.InteractiveShell.cache_size = 500\n")
    argv = ["--profile-dir", str(profile), "--ext=autoreload", "--InteractiveShell.cache_size", "123"]
    km, kc = _kernel(jupyter_path, "tk-profile-dir", argv, tmp_path / "ipython")
    try:
        code = (
            "ip = get_ipython()\n"
            "print(ip.profile_dir.location, ip.cache_size,"
            " 'IPython.extensions.autoreload' in ip.extension_manager.loaded)"
        )
        r, out = execute(kc, code)
        assert r["content"]["status"] == "ok", r["content"]
        assert stdout_of(out) == f"{profile} 123 True\n"
    finally:
        stop_kernel(km, kc)


def test_sys_path_has_the_empty_entry_before_site_packages(jupyter_path: str, tmp_path: pathlib.Path) -> None:
    """As ipykernel (InteractiveShellApp.init_path): ``''``, after the standard
    library, so imports follow ``%cd`` and a notebook's ``statistics.py`` does
    not shadow the standard library; the absolute working directory is not on
    sys.path (before: it was first)."""
    (tmp_path / "statistics.py").write_text("raise ImportError('the notebook folder shadowed the stdlib')\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mymodule.py").write_text("VALUE = 42\n")
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="trikernel-test-signal")
    km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=30)
        code = (
            "import sys, os, statistics\n"
            "i = sys.path.index('')\n"
            "before = [p for p in sys.path[:i] if 'site-packages' in p]\n"
            "%cd sub\n"
            "import mymodule\n"
            "(before, os.getcwd() in sys.path, mymodule.VALUE)"
        )
        r, out = execute(kc, code)
        assert r["content"]["status"] == "ok", r["content"]
        assert _values(out)[-1] == "([], False, 42)"
    finally:
        stop_kernel(km, kc)


def test_pylab_on_the_command_line_sets_up_matplotlib_and_numpy(jupyter_path: str, tmp_path: pathlib.Path) -> None:
    """``--pylab=inline`` (InteractiveShellApp.init_gui_pylab, as ipykernel runs it):
    matplotlib's inline backend, ``np`` and ``plt`` in the namespace."""
    km, kc = _kernel(jupyter_path, "tk-pylab", ["--pylab=inline"], tmp_path)
    try:
        r, out = execute(kc, "import matplotlib\nprint(matplotlib.get_backend(), np.__name__, plt.__name__)")
        assert r["content"]["status"] == "ok", r["content"]
        assert stdout_of(out).split()[1:] == ["numpy", "matplotlib.pyplot"]
        assert "inline" in stdout_of(out).split()[0]
    finally:
        stop_kernel(km, kc)
