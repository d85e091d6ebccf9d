"""``deadlines audit PATH...``: report the unbounded waits in a code base.

Prints ``path:line:col CODE message`` (or ``--format json``: a list of ``{path, line,
col, code, message}``). Exit status: 0 clean, 1 findings, 2 a file could not be
read or parsed.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import RULES, audit_paths


def _codes(text: str) -> list[str]:
    codes = [code.strip().upper() for code in text.split(",") if code.strip()]
    if not codes:
        raise argparse.ArgumentTypeError(f"expected codes or prefixes of {', '.join(RULES)}")
    for code in codes:
        if not any(known.startswith(code) for known in RULES):
            # A typo must not hide every finding.
            raise argparse.ArgumentTypeError(
                f"unknown code {code!r}; expected codes or prefixes of {', '.join(RULES)}"
            )
    return codes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``deadlines audit``."""
    parser.add_argument("paths", nargs="*", default=["."], metavar="PATH", help="files or dirs")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--select", type=_codes, help="only these codes or prefixes (DLN101,DLN10)")
    parser.add_argument("--ignore", type=_codes, default=[], help="skip these codes or prefixes")
    parser.add_argument(
        "--exclude", action="append", default=[], metavar="GLOB", help="skip matching paths"
    )
    parser.add_argument("--list-rules", action="store_true", help="print the rules and exit")


def run(args: argparse.Namespace) -> int:
    """Run the audit; returns the exit status."""
    if args.list_rules:
        for rule in RULES.values():
            print(f"{rule.code}  {rule.name}: {rule.summary}")
        return 0
    findings, errors = audit_paths(
        args.paths, select=args.select, ignore=args.ignore, exclude=args.exclude
    )
    if args.format == "json":
        print(json.dumps([f.as_dict() for f in findings], indent=2))
    else:
        for finding in findings:
            print(finding)
    for error in errors:
        print(f"deadlines audit: {error}", file=sys.stderr)
    if errors:
        return 2
    return 1 if findings else 0
