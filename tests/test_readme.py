"""The README's two set-up commands are exactly what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Set-up: two commands", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```\n(.*?)```", section, flags=re.S)]


def test_readme_has_two_commands_and_ci_runs_them() -> None:
    commands = readme_commands()
    assert len(commands) == 2
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    for command in commands:
        assert command in ci, command
    assert "python -m pytest" in commands[1]
    assert "jupyter execute --kernel_name=trikernel examples/tour.ipynb" in commands[0]
    assert ci[-1] == commands[1], "the tests are the last thing CI runs"


def test_ci_lints_and_type_checks_before_the_tests() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    tests = ci.index(readme_commands()[1])
    for check in ("ruff check .", "ruff format --check .", "mypy"):
        before = [i for i, line in enumerate(ci[:tests]) if not line.lstrip().startswith("#") and check in line]
        assert before, f"{check!r} does not run before the tests"
