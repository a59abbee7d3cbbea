"""What `kerasmgpu migrate` tells the user: findings, their severity, the summary.

Pure Python (no libcst): the command, the tests and the rule families share these types.
"""

from __future__ import annotations

import difflib
import enum
from dataclasses import dataclass, field, replace
from typing import Dict, Iterable, List, Optional, Sequence, Tuple


class Severity(str, enum.Enum):
    """How much a finding needs the user.

    INFO: a rewrite that keeps the program's behaviour, or a note that needs no action.
    WARNING: the code runs on the target, but a rewrite or the code left as it was can
    behave differently there (the message says what changes): read it.
    ERROR: the code will not run (or not correctly) on the target and was not rewritten;
    `--check` fails while one remains.
    """

    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"

    def __str__(self) -> str:
        return self.value


class Target(str, enum.Enum):
    """The Keras a project is migrated to (`--to`)."""

    KERAS3 = "keras3"
    TF_KERAS = "tf_keras"
    KERAS23 = "keras23"

    def __str__(self) -> str:
        return self.value

    @property
    def modern(self) -> bool:
        """Whether the project leaves Keras 2.3 (Keras 3 or tf_keras)."""
        return self is not Target.KERAS23


DEFAULT_TARGET = Target.KERAS3


def parse_target(value: object) -> Target:
    """`Target` from a `Target` or its name, else a ValueError in received/allowed/fix form."""
    if isinstance(value, Target):
        return value
    for target in Target:
        if value == target.value:
            return target
    allowed = ", ".join(repr(t.value) for t in Target)
    raise ValueError(
        f"Received: target={value!r}. Allowed: {allowed}. Fix: pass one of them "
        "(`--to keras3` on the command line)."
    )


@dataclass(frozen=True)
class Finding:
    """One thing the codemod did or found, at a place in a file.

    `line` and `col` are 1-based, in the source that was analysed; `rule` names the rule
    family (`multi_gpu`, `generators`, ...).
    """

    filename: str
    line: int
    col: int
    severity: Severity
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.line}:{self.col}: {self.severity}: {self.message}"


@dataclass(frozen=True)
class MigrationResult:
    """What `migrate_source` produced: the new text, whether it differs, the findings.

    `renamed`: each weight-file path literal the file renames where it writes it, with
    its new text and the line (`migrate_source(..., renamed_elsewhere=)` of the project's
    other files then follows it where they read it).
    """

    new_source: str
    changed: bool
    findings: List[Finding]
    renamed: Dict[str, Tuple[str, int]] = field(default_factory=dict)
    # each line of the source -> its line in new_source, where the codemod knows it
    lines: Dict[int, int] = field(default_factory=dict, compare=False, repr=False)

    def count(self, severity: Severity) -> int:
        return sum(1 for finding in self.findings if finding.severity is severity)


class MigrationError(ValueError):
    """The source could not be parsed, so it cannot be migrated (it is left as it was)."""

    def __init__(self, filename: str, reason: str, line: int = 1, col: int = 1) -> None:
        self.filename = filename
        self.reason = reason
        self.line = line
        self.col = col
        super().__init__(
            f"Cannot migrate {filename}: cannot parse: {reason}. Allowed: Python 3 source "
            "that parses. Fix: correct the syntax (convert Python 2 files with 2to3 first), "
            "then run kerasmgpu migrate again."
        )


def moved_lines(old: str, new: str) -> Dict[int, int]:
    """For each 1-based line of `old`, the line of `new` where it is now.

    A rewritten line maps to the first line of what replaced it, so a finding about it
    points at the rewritten code; lines added before it (an import) push it down.
    """
    old_lines = old.splitlines(keepends=True)
    new_lines = new.splitlines(keepends=True)
    mapping: Dict[int, int] = {}
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        for offset, line in enumerate(range(i1, i2)):
            if tag == "equal":
                mapping[line + 1] = j1 + offset + 1
            elif j2 > j1:  # replaced: the most similar line of the new block, in order
                start = mapping.get(line, j1) if offset else j1
                candidates = range(max(start, j1), j2)
                best = max(candidates, key=lambda j: (difflib.SequenceMatcher(
                    a=old_lines[line], b=new_lines[j]).ratio(), -j), default=j2 - 1)
                mapping[line + 1] = best + 1
            else:  # deleted: the line that follows now
                mapping[line + 1] = j1 + 1
    return mapping


def relocate(findings: Sequence[Finding], old: str, new: str,
             known: Optional[Dict[int, int]] = None) -> List[Finding]:
    """The findings with their lines moved into `new` (the file written by --write).

    `known`: the lines the codemod placed itself (`MigrationResult.lines`), which win over
    the text diff's guess.
    """
    mapping = {**moved_lines(old, new), **(known or {})}
    last = max(1, len(new.splitlines()))
    return [
        replace(finding, line=min(mapping.get(finding.line, finding.line), last))
        for finding in findings
    ]


def summary_line(
    target: Target, verb: str, changed: int, unchanged: int, failed: int,
    findings: Iterable[Finding],
) -> str:
    """`kerasmgpu migrate --to keras3: 3 file(s) rewritten, 2 unchanged; 1 ERROR, ...`."""
    counts = {severity: 0 for severity in Severity}
    for finding in findings:
        counts[finding.severity] += 1
    text = f"kerasmgpu migrate --to {target}: {changed} file(s) {verb}, {unchanged} unchanged"
    if failed:
        text += f", {failed} could not be migrated"
    text += "; " + ", ".join(f"{counts[s]} {s}" for s in (Severity.ERROR, Severity.WARNING,
                                                          Severity.INFO))
    return text
