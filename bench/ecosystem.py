"""The ecosystem's own test suites, with trikernel installed as the default ``python3`` kernel.

Issue 25's yardstick (docs/compatibility.md, "Test suites"): the tests other
projects wrote against ipykernel, run unchanged, once with ipykernel's
``python3`` kernelspec and once with trikernel installed as ``python3``
(``python -m trikernel install --prefix TMP --name python3``, the way a user
makes it the default), each in a temporary ``JUPYTER_PATH`` of its own and a
fresh ``IPYTHONDIR``:

- ``nbclient``: ``tests/test_client.py`` of nbclient's sdist (it executes its
  notebooks and compares their outputs; ``jupyter execute``, papermill and
  testbook drive the same code);
- ``ipykernel``: ipykernel's black-box test files ``tests/test_message_spec.py``,
  ``test_kernel.py``, ``test_subshells.py``, ``test_debugger.py`` (kernels in
  subprocesses through jupyter_client, as a frontend drives them).

The sdists are downloaded from PyPI with pip (the versions installed here,
unless given), unpacked into the work directory and run from there with
pytest, serially, 120 s per test. Outcomes come from pytest's JUnit XML; the
script prints one table (passed / failed / skipped per suite and column) and
every test whose outcome differs between the columns, and writes
``bench/results/ecosystem.{md,json}``. Nothing is asserted: the figures are
recorded in docs/compatibility.md.

The suites need their own test requirements (``pip install -e '.[ecosystem]'``);
the script says which are missing. About 10 minutes on 2 cores.

Usage: python bench/ecosystem.py [--suite nbclient|ipykernel|all] [--column ipykernel|trikernel|both]
       [--workdir DIR] [--nbclient-version V] [--ipykernel-version V] [-k EXPR]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter

BENCH_DIR = pathlib.Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"

#: suite -> (PyPI project, test files inside its sdist)
SUITES: dict[str, tuple[str, tuple[str, ...]]] = {
    "nbclient": ("nbclient", ("tests/test_client.py",)),
    "ipykernel": (
        "ipykernel",
        ("tests/test_message_spec.py", "tests/test_kernel.py", "tests/test_subshells.py", "tests/test_debugger.py"),
    ),
}
COLUMNS = ("ipykernel", "trikernel")
#: What the two suites import beyond trikernel's test extra (module -> requirement).
NEEDED = {
    "flaky": "flaky",
    "testpath": "testpath",
    "xmltodict": "xmltodict",
    "pytest_asyncio": "pytest-asyncio",
    "pytest_timeout": "pytest-timeout",
    "nbconvert": "nbconvert",
    "psutil": "psutil",
    "ipywidgets": "ipywidgets",
    "pytest_cov": "pytest-cov",  # ipykernel's test_run_concurrently_sequence reads the --cov option
}
#: pytest options: serial, no cache written into the sdist, the sdists' own addopts and
#: warning-as-error filters off (pytest-asyncio's loop-scope warning would stop collection)
PYTEST_ARGS = (
    "-p",
    "no:cacheprovider",
    "-p",
    "no:xdist",
    "-p",
    "no:dash",
    "-o",
    "addopts=",
    "-o",
    "asyncio_default_fixture_loop_scope=function",
    "-W",
    "default",
    "-q",
    "-rN",
    "--timeout",
    "120",
)


def missing_requirements() -> list[str]:
    return [req for mod, req in NEEDED.items() if importlib.util.find_spec(mod) is None]


def sdist(project: str, version: str, workdir: pathlib.Path) -> pathlib.Path:
    """The unpacked sdist of ``project==version`` (downloaded once into ``workdir``)."""
    root = workdir / f"{project}-{version}"
    if root.is_dir():
        return root
    archive = workdir / f"{project}-{version}.tar.gz"
    if not archive.exists():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", project]
        subprocess.run([*cmd, f"{project}=={version}", "-d", str(workdir)], check=True, capture_output=True)
    with tarfile.open(archive) as tar:
        tar.extractall(workdir, filter="data")
    return root


def kernelspec_dir(column: str, workdir: pathlib.Path) -> str:
    """A JUPYTER_PATH entry whose ``python3`` kernelspec is ``column``'s."""
    prefix = workdir / f"kernels-{column}"
    if column == "trikernel":
        cmd = [sys.executable, "-m", "trikernel", "install", "--prefix", str(prefix), "--name", "python3"]
        subprocess.run(cmd, check=True, capture_output=True)
    else:
        spec = prefix / "share" / "jupyter" / "kernels" / "python3"
        spec.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        kernel = {
            "argv": argv,
            "display_name": "Python 3 (ipykernel)",
            "language": "python",
            "metadata": {"debugger": True},
        }
        (spec / "kernel.json").write_text(json.dumps(kernel, indent=1))
    return str(prefix / "share" / "jupyter")


def outcomes(junit: pathlib.Path) -> dict[str, str]:
    """test id -> passed / failed / error / skipped, from pytest's JUnit XML."""
    out: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        classname = case.get("classname", "")
        test_id = f"{classname.replace('.', '/')}.py::{case.get('name')}" if classname else str(case.get("name"))
        kinds = {child.tag for child in case}
        out[test_id] = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed").replace(
            "failure", "failed"
        )
    return out


def run(suite: str, column: str, root: pathlib.Path, workdir: pathlib.Path, keyword: str | None) -> dict[str, str]:
    """Run ``suite``'s files in ``root`` against ``column``'s python3 kernelspec."""
    files = SUITES[suite][1]
    junit = workdir / f"{suite}-{column}.xml"
    log = workdir / f"{suite}-{column}.log"
    env = dict(os.environ)
    env["JUPYTER_PATH"] = kernelspec_dir(column, workdir)
    env["IPYTHONDIR"] = tempfile.mkdtemp(prefix=f"ipython-{column}-", dir=workdir)
    env.pop("PYTEST_ADDOPTS", None)
    args = [sys.executable, "-m", "pytest", *PYTEST_ARGS, f"--junitxml={junit}", *files]
    if keyword:
        args += ["-k", keyword]
    t0 = time.monotonic()
    with open(log, "w") as f:
        subprocess.run(args, cwd=root, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=3600, check=False)
    print(f"  {suite} on {column}: {time.monotonic() - t0:.0f} s (log: {log})", flush=True)
    return outcomes(junit)


def summary(results: dict[str, str]) -> str:
    counts = Counter(results.values())
    parts = [f"{counts[k]} {k}" for k in ("passed", "failed", "error", "skipped") if counts[k]]
    return ", ".join(parts) or "nothing ran"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=[*SUITES, "all"], default="all")
    p.add_argument("--column", choices=[*COLUMNS, "both"], default="both")
    p.add_argument("--workdir", type=pathlib.Path, default=None, help="keep sdists, logs and JUnit XML here")
    p.add_argument("--nbclient-version", default=importlib.metadata.version("nbclient"))
    p.add_argument("--ipykernel-version", default=importlib.metadata.version("ipykernel"))
    p.add_argument("-k", dest="keyword", default=None, help="pytest -k expression")
    args = p.parse_args()

    missing = missing_requirements()
    if missing:
        print(f"ecosystem.py: the suites need {', '.join(missing)}: pip install -e '.[ecosystem]'", file=sys.stderr)
        return 2
    workdir = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="trikernel-ecosystem-"))
    workdir.mkdir(parents=True, exist_ok=True)
    versions = {"nbclient": args.nbclient_version, "ipykernel": args.ipykernel_version}
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    columns = list(COLUMNS) if args.column == "both" else [args.column]

    results: dict[str, dict[str, dict[str, str]]] = {}
    for suite in suites:
        project = SUITES[suite][0]
        root = sdist(project, versions[project], workdir)
        print(f"{project} {versions[project]} ({root})", flush=True)
        results[suite] = {column: run(suite, column, root, workdir, args.keyword) for column in columns}

    v = importlib.metadata.version
    lines = [
        f"trikernel {v('trikernel')}, ipykernel {v('ipykernel')}, IPython {v('ipython')}, "
        f"jupyter_client {v('jupyter_client')}, traitlets {v('traitlets')}, Python {sys.version.split()[0]}",
        "",
        "| suite | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for suite in suites:
        name = f"{SUITES[suite][0]} {versions[SUITES[suite][0]]} `{' '.join(SUITES[suite][1])}`"
        lines.append(f"| {name} | " + " | ".join(summary(results[suite][c]) for c in columns) + " |")
    if len(columns) == 2:
        for suite in suites:
            a, b = (results[suite][c] for c in columns)
            differ = sorted(t for t in set(a) | set(b) if a.get(t) != b.get(t))
            lines += ["", f"{suite}: outcomes that differ ({len(differ)})", ""]
            lines += [f"- `{t}`: {columns[0]} {a.get(t, '-')}, {columns[1]} {b.get(t, '-')}" for t in differ]
    text = "\n".join(lines)
    print(text)
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "ecosystem.md").write_text(text + "\n")
    (RESULTS_DIR / "ecosystem.json").write_text(json.dumps({"versions": versions, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
