"""The commands README.md, docs/handshake.md and docs/compatibility.md show still work (issue 28).

Every inline or fenced code span of the two files that is a command is
checked against what the code accepts: ``python -m trikernel`` commands
through the CLI's own parsers (an ``install`` that names no placeholder is
run for real into a temporary prefix), extras against pyproject.toml,
scripts and the provisioner against its entry points, files against the
clone, and the kernelspec docs/handshake.md shows against the one
``install --handshake`` writes.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from trikernel.launch import cli
from trikernel.launch.gateway import launch_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/handshake.md", "docs/compatibility.md")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def code_spans(text: str) -> list[str]:
    """Fenced blocks (line by line) and inline code spans of a Markdown text."""
    spans: list[str] = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        spans += [line.strip() for line in block.splitlines() if line.strip()]
    rest = re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S)
    spans += [" ".join(m.split()) for m in re.findall(r"`([^`]+)`", rest)]
    return spans


COMMAND = r"(\w+=\S+ )*(python3? -m (trikernel|venv)|pip install|jupyter |trikernel-conformance)"


def commands() -> list[tuple[str, str]]:
    """(file, command) for each shell command: `a && b` are two."""
    out = []
    for name in DOCS:
        for span in code_spans((ROOT / name).read_text(encoding="utf-8")):
            for part in span.split("&&"):
                part = part.strip()
                if re.match(
                    r"(\w+=\S+ )*(python3? -m (trikernel|venv)|pip install|jupyter |trikernel-conformance)", part
                ):
                    out.append((name, part))
    return out


ALL = commands()


def _ids(cases: list[tuple[str, str]]) -> list[str]:
    return [f"{name}: {cmd}"[:90] for name, cmd in cases]


def options_of(parser: object) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}  # type: ignore[attr-defined]


def test_the_docs_show_the_commands_this_test_checks() -> None:
    """The extraction finds what matters; an empty list would pass everything below."""
    text = " ".join(cmd for _, cmd in ALL)
    for needed in ("python -m trikernel install --user", "python -m trikernel install --handshake", "pip install"):
        assert needed in text, needed
    assert len(ALL) >= 10


TRIKERNEL = [(n, c) for n, c in ALL if re.match(r"python3? -m trikernel", c)]


@pytest.mark.parametrize(("doc", "command"), TRIKERNEL, ids=_ids(TRIKERNEL))
def test_trikernel_command_options_exist(doc: str, command: str) -> None:
    """Every --option a doc shows is one the CLI accepts, for its sub-command."""
    words = command.split()[3:]
    sub = words[0] if words and words[0] in ("install", "gateway-launch") else None
    parser = {"install": cli._install_parser(), "gateway-launch": launch_parser(), None: cli._run_parser()}[sub]
    known = options_of(parser)
    shown = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-f)\b", command))
    if sub is None and shown - known:
        # the run command hands the rest to IPython: only trikernel's own spellings are checked
        shown = {o for o in shown if o.startswith(("--iopub", "--handshake", "--socket", "--max", "--log"))}
    assert shown <= known, f"{doc} shows {sorted(shown - known)}, which `{command}` does not accept"


def _concrete(command: str) -> bool:
    return not re.search(r"[\[\]|…]|\.\.\.|\b[A-Z]{1,}\b", command.replace("CHANNEL.NAME=VALUE", ""))


INSTALLS = [(n, c) for n, c in TRIKERNEL if " install" in c and _concrete(c)]


@pytest.mark.parametrize(("doc", "command"), INSTALLS, ids=_ids(INSTALLS))
def test_install_commands_run(doc: str, command: str, tmp_path: Path) -> None:
    """An install command of the docs, run as shown (its destination moved under a temporary
    folder: --sys-prefix and the system-wide default become --prefix, --user a JUPYTER_DATA_DIR),
    writes a kernelspec that names this interpreter and trikernel."""
    argv = shlex.split(command)[3:]
    argv = [a for a in argv if a != "--sys-prefix"]
    env = dict(os.environ, JUPYTER_DATA_DIR=str(tmp_path / "user"))
    if "--user" not in argv and "--prefix" not in argv:
        argv += ["--prefix", str(tmp_path / "prefix")]
    done = subprocess.run(
        [sys.executable, "-m", "trikernel", *argv], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    specs = list(tmp_path.rglob("kernel.json"))
    assert len(specs) == 1, specs
    spec = json.loads(specs[0].read_text(encoding="utf-8"))
    assert spec["argv"][0] == sys.executable
    assert spec["argv"][-4:] == ["-m", "trikernel", "-f", "{connection_file}"]
    if "--handshake" in argv:
        assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == "trikernel-handshake"
        assert "another environment" in done.stdout, "install --handshake says what such a server needs"


RUNS = [(n, c) for n, c in TRIKERNEL if " -f " in c and _concrete(c)]


@pytest.mark.parametrize(("doc", "command"), RUNS, ids=_ids(RUNS))
def test_run_commands_parse(doc: str, command: str) -> None:
    """A `python -m trikernel -f FILE ...` the docs show parses as the kernel parses it."""
    args, _config, _ipython = cli._parse_run_args(shlex.split(command)[3:])
    assert args.connection_file


def test_the_help_and_install_help_the_readme_points_at_work() -> None:
    for argv in (["--help"], ["install", "--help"], ["gateway-launch", "--help"]):
        done = subprocess.run([sys.executable, "-m", "trikernel", *argv], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (argv, done.stderr)
    top = subprocess.run([sys.executable, "-m", "trikernel", "--help"], capture_output=True, text=True, timeout=120)
    assert "gateway-launch" in top.stdout
    assert "install" in top.stdout


PIPS = [(n, c) for n, c in ALL if c.startswith("pip install")]


@pytest.mark.parametrize(("doc", "command"), PIPS, ids=_ids(PIPS))
def test_pip_extras_exist(doc: str, command: str) -> None:
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    for target in shlex.split(command)[2:]:
        m = re.fullmatch(r"(?:\.|trikernel)\[([\w,-]+)\]", target)
        if m:
            shown = set(m.group(1).split(","))
            assert shown <= extras, f"{doc}: extras {sorted(shown - extras)} are not in pyproject.toml"
        else:
            assert target in (".", "trikernel", "-e"), f"{doc}: pip installs {target!r}"


def test_scripts_files_and_provisioner_the_docs_name_exist() -> None:
    text = " ".join((ROOT / n).read_text(encoding="utf-8") for n in DOCS)
    scripts = PYPROJECT["project"]["scripts"]
    for script in set(re.findall(r"`(trikernel-[a-z]+)", text)) - {"trikernel-handshake"}:
        assert script in scripts, script
    provisioners = PYPROJECT["project"]["entry-points"]["jupyter_client.kernel_provisioners"]
    for name in set(re.findall(r"provisioner_name\W+(trikernel-[a-z]+)", text)) | {"trikernel-handshake"}:
        assert name in provisioners, name
    for _, command in ALL:
        for path in re.findall(r"(examples/\S+\.(?:ipynb|py))", command):
            assert (ROOT / path).exists(), path
        m = re.search(r"--kernel(?:_name=| )(\S+)", command)
        if m and m.group(1) == "trikernel":
            assert (ROOT / "kernelspec" / "trikernel" / "kernel.json").exists(), "the wheel's kernelspec"
    for module, attr in re.findall(r"`(trikernel(?:\.\w+)+):(\w+)`", text):
        assert hasattr(importlib.import_module(module), attr), f"{module}:{attr}"


def test_handshake_doc_shows_the_kernelspec_install_writes(tmp_path: Path) -> None:
    """docs/handshake.md's trikernel kernelspec has the keys and argv shape `install --handshake`
    writes (the interpreter's absolute path in argv[0])."""
    text = (ROOT / "docs" / "handshake.md").read_text(encoding="utf-8")
    shown = [
        json.loads(b)
        for b in re.findall(r"```json\n(.*?)```", text, flags=re.S)
        if '"argv"' in b and '"trikernel"' in b
    ]
    assert shown, "docs/handshake.md shows a trikernel kernelspec"
    subprocess.run(
        [sys.executable, "-m", "trikernel", "install", "--handshake", "--prefix", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (written,) = tmp_path.rglob("kernel.json")
    spec = json.loads(written.read_text(encoding="utf-8"))
    for doc_spec in shown:
        assert os.path.isabs(doc_spec["argv"][0])
        assert doc_spec["argv"][1:] == spec["argv"][1:]
        assert doc_spec["kernel_protocol_version"] == spec["kernel_protocol_version"]
        assert doc_spec["metadata"]["kernel_provisioner"] == spec["metadata"]["kernel_provisioner"]
