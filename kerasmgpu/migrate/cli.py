"""`kerasmgpu migrate PATH... [--to TARGET] [--write | --check] [--diff]`: the command."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from typing import List, Optional, TextIO, Tuple

from kerasmgpu._atomic import write_atomic
from kerasmgpu.migrate import files
from kerasmgpu.migrate.report import (
    DEFAULT_TARGET,
    Finding,
    MigrationError,
    MigrationResult,
    Severity,
    Target,
    relocate,
    summary_line,
)

DESCRIPTION = (
    "Migrate a Keras 2.3 project to modern Keras: multi-GPU code to kerasmgpu, and the "
    "Keras 2.3 API that modern Keras removed or changed (generator methods, optimizer "
    "arguments, moved modules, Keras 1 names, backend functions, TF1 sessions, weight files, "
    "callback arguments). Prints a report: a summary, then one "
    "'path:line:col: INFO|WARNING|ERROR: message' line per finding. INFO: rewritten, same "
    "behaviour. WARNING: runs on the target but can behave differently there (the message "
    "says how). ERROR: will not run on the target and was not rewritten. Lines cite each file "
    "as it is on disk when the command ends (the rewritten file after --write)."
)
TARGET_HELP = (
    "the Keras to migrate to (default: keras3, the Keras that `pip install keras` and "
    "TensorFlow >= 2.16 give today). keras3: Keras 3 on TensorFlow, JAX or PyTorch. "
    "tf_keras: tf_keras 2.16+ (Keras 2 kept alive for TensorFlow); imports become "
    "`import tf_keras as keras` / `from tf_keras... import`, so no TF_USE_LEGACY_KERAS is "
    "needed for your code. keras23: stay on Keras 2.3.1 (multi-GPU code moves to "
    "kerasmgpu.legacy only)"
)
CHECK_HELP = (
    "change nothing; exit 1 when a file would be rewritten or an ERROR remains (WARNING "
    "and INFO alone do not fail the check)"
)


@dataclass
class _Tally:
    changed: List[str] = field(default_factory=list)
    unchanged: int = 0
    failed: int = 0
    findings: List[Finding] = field(default_factory=list)
    lines: List[str] = field(default_factory=list)  # the report's lines, after the summary


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kerasmgpu migrate", description=DESCRIPTION)
    parser.add_argument("--to", dest="target", default=DEFAULT_TARGET.value,
                        choices=[t.value for t in Target], help=TARGET_HELP)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the files in place")
    mode.add_argument("--check", action="store_true", help=CHECK_HELP)
    parser.add_argument("--diff", action="store_true",
                        help="also print the unified diff of every file that changes")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or directories")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """`kerasmgpu migrate PATH...` (argv excludes the word `migrate`).

    Exit status: 0 done; 1 with --check when a file would change or an ERROR remains;
    2 when a path is missing, a file cannot be read or parsed, or libcst is missing.
    """
    from kerasmgpu.migrate.entry import import_libcst, migrate_source

    args = _parser().parse_args(argv)
    target = Target(args.target)
    try:
        import_libcst()
    except ImportError as exc:
        print(f"kerasmgpu migrate: {exc}", file=sys.stderr)
        return 2
    missing = [path for path in args.paths if not os.path.exists(path)]
    if missing:
        # Checked before touching anything, so a typo never leaves a half-migrated tree.
        for path in missing:
            print(
                f"kerasmgpu migrate: no such file or directory. Received: {path!r}. "
                "Allowed: existing .py files or directories. Fix: check the path.",
                file=sys.stderr,
            )
        return 2

    tally = _Tally()
    done: List[Tuple[str, str, str, MigrationResult]] = []
    for path in files.iter_files(args.paths):
        migrated = _migrate_one(path, target, tally, migrate_source)
        if migrated is not None:
            done.append(migrated)
    # Second pass: a file that spells a weight file another file now writes under a new
    # name reads that file (a resume, an evaluation script): it follows the new name.
    written = {old: (new, f"{path}:{line}") for path, _, _, result in done
               for old, (new, line) in result.renamed.items()}
    for index, (path, text, encoding, result) in enumerate(done):
        elsewhere = {old: found for old, found in written.items()
                     if old not in result.renamed and old in text}
        if elsewhere:
            result = migrate_source(text, path, target, elsewhere)
            done[index] = (path, text, encoding, result)
    for path, text, encoding, result in done:
        _report_one(path, text, encoding, result, args, tally)
    return _finish(args, target, tally, sys.stdout)


def _migrate_one(path: str, target: Target, tally: _Tally, migrate_source: object,
                 ) -> Optional[Tuple[str, str, str, MigrationResult]]:
    try:
        text, encoding = files.read(path)
    except (OSError, SyntaxError, UnicodeDecodeError, LookupError) as exc:
        _unreadable(path, 1, 1, f"cannot read it as Python source: {exc}", tally)
        return None
    try:
        result = migrate_source(text, path, target)  # type: ignore[operator]
    except MigrationError as exc:
        _unreadable(path, exc.line, exc.col, f"cannot parse: {exc.reason}; left unchanged "
                    "(Python 2 files need 2to3 first)", tally)
        return None
    return path, text, encoding, result


def _report_one(path: str, text: str, encoding: str, result: MigrationResult,
                args: argparse.Namespace, tally: _Tally) -> None:
    findings = list(result.findings)
    if not result.changed:
        tally.unchanged += 1
    elif args.write:
        try:
            write_atomic(path, result.new_source.encode(encoding))
        except OSError as exc:
            _unreadable(path, 1, 1, f"cannot write: {exc}; left unchanged", tally)
            return
        tally.changed.append(path)
        # Inserted and split imports move lines: cite the file the user opens now.
        findings = relocate(findings, text, result.new_source, result.lines)
    else:
        tally.changed.append(path)
    if args.diff and result.changed:
        sys.stdout.write(files.diff(path, text, result.new_source))
    tally.findings.extend(findings)
    tally.lines.extend(str(finding) for finding in findings)


def _unreadable(path: str, line: int, col: int, message: str, tally: _Tally) -> None:
    finding = Finding(path, line, col, Severity.ERROR, "parse", message)
    tally.failed += 1
    tally.findings.append(finding)
    tally.lines.append(str(finding))


def _finish(args: argparse.Namespace, target: Target, tally: _Tally, out: TextIO) -> int:
    verb = "rewritten" if args.write else "to rewrite"
    total = len(tally.changed)
    print(summary_line(target, verb, total, tally.unchanged, tally.failed, tally.findings),
          file=out)
    for line in tally.lines:
        print(line, file=out)
    if args.check:
        for path in tally.changed:
            print(f"would rewrite: {path}", file=out)
    elif not args.write and tally.changed:
        print("run with --write to apply (--diff shows the changes)", file=out)
    if tally.failed:
        return 2
    errors = any(finding.severity is Severity.ERROR for finding in tally.findings)
    return 1 if args.check and (tally.changed or errors) else 0
