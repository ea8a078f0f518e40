"""Command line: ``trikernel-conformance [--json] [--check NAME]... [--list] KERNELSPEC``.

Prints one row per check as it is decided (status, name, figure, spec
section), then a summary; ``--json`` prints one JSON object instead.
Exit status: 0 when no check failed, 1 when any did, 2 for a usage error
(one line on stderr, naming the problem).

Runs on: the main thread of the client's process (the
``trikernel-conformance`` command); no threads of its own.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap

from trikernel.conformance.catalogue import catalogue
from trikernel.conformance.runner import Report, Row, UsageError, run


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trikernel-conformance",
        description="Run the Jupyter protocol conformance suite against a kernelspec (docs/conformance.md).",
    )
    p.add_argument("kernelspec", nargs="?", help="kernelspec name, as `jupyter kernelspec list` shows it")
    p.add_argument("--json", action="store_true", help="print one JSON object with every row instead of the table")
    p.add_argument(
        "--check",
        action="append",
        dest="checks",
        metavar="NAME",
        help="run only this check; a glob (iopub.*) or a group (iopub) works too; repeatable",
    )
    p.add_argument("--list", action="store_true", help="list the checks with their spec sections and exit")
    p.add_argument(
        "--timeout-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="multiply every deadline by X (a slow machine or kernel); default 1",
    )
    return p


def _list() -> int:
    for c in catalogue():
        print(f"{c.name:<28} {c.summary}")
        print(f"{'':<28} [{c.section}]{' (phase: ' + c.phase + ')' if c.phase != 'shared' else ''}")
    return 0


def _print_row(row: Row) -> None:
    width = 28
    lines = textwrap.wrap(row.figure, 100) or [""]
    print(f"{row.status:<4}  {row.name:<{width}} {lines[0]}")
    for more in lines[1:]:
        print(f"{'':<6}{'':<{width}} {more}")
    print(f"{'':<6}{'':<{width}} [{row.section}; {row.seconds:.1f} s]", flush=True)


def _print_start(report: Report) -> None:
    print(
        f"kernel {report.kernel!r} ({report.display_name}): {report.implementation or '?'}, "
        f"protocol {report.protocol_version or '?'}, interrupt_mode {report.interrupt_mode}, "
        f"JEP 66 handshake {'yes' if report.handshake else 'no'}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    """The ``trikernel-conformance`` command: parse ``argv`` (``sys.argv[1:]`` when None), run
    the selected checks against the kernelspec and print a row per check and a summary, or one
    JSON object with ``--json``. Returns the exit status: 0 when no check failed, 1 when one
    did, 2 for a usage error (one line on stderr)."""
    args = _parser().parse_args(argv)
    if args.list:
        return _list()
    if not args.kernelspec:
        print("trikernel-conformance: a KERNELSPEC name is required (or --list)", file=sys.stderr)
        return 2
    if args.timeout_scale <= 0:
        print("trikernel-conformance: --timeout-scale must be positive", file=sys.stderr)
        return 2
    try:
        report = run(
            args.kernelspec,
            args.checks,
            timeout_scale=args.timeout_scale,
            on_row=None if args.json else _print_row,
            on_start=None if args.json else _print_start,
        )
    except UsageError as exc:
        print(f"trikernel-conformance: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.as_json(), indent=1))
    else:
        n = report.counts()
        print(f"{n['PASS']} PASS, {n['FAIL']} FAIL, {n['SKIP']} SKIP in {report.seconds:.1f} s")
    return 1 if report.failed else 0
