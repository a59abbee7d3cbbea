"""The codemod's entry points below the command line: `migrate_source` and the check
that libcst is there. Apart from `__init__` (which re-exports them) so that `cli`, which
`__init__.main` imports, does not import `__init__` back: no import cycle."""

from __future__ import annotations

from typing import Mapping, Optional, Tuple, Union

from kerasmgpu.migrate.report import DEFAULT_TARGET, MigrationResult, Target, parse_target

INSTALL_HINT = 'pip install "kerasmgpu[tools]"'


def import_libcst() -> None:
    """Fail with the install command when the optional libcst is missing."""
    try:
        import libcst  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "kerasmgpu migrate needs libcst, which is not installed. Received: no module "
            f"named 'libcst'. Allowed: libcst>=1.1 (the 'tools' extra). Fix: {INSTALL_HINT}"
        ) from exc


def migrate_source(source: str, filename: str = "<string>",
                   target: Union[str, Target] = DEFAULT_TARGET,
                   renamed_elsewhere: Optional[Mapping[str, Tuple[str, str]]] = None,
                   ) -> MigrationResult:
    """Migrate one file's text to `target` ("keras3", "tf_keras" or "keras23").

    Returns the new text and the findings, which cite lines of `source`.
    `renamed_elsewhere`: weight-file path literals other files of the project rename where
    they write them, `{old: (new, "path:line")}` (their results' `renamed`): where this
    file spells one, it reads that file, and follows the new name. Raises
    `MigrationError` (a ValueError) when `source` does not parse, ValueError for an unknown
    target, and ImportError naming `pip install "kerasmgpu[tools]"` when libcst is missing.
    """
    chosen = parse_target(target)
    import_libcst()
    from kerasmgpu.migrate import engine

    return engine.run(source, filename, chosen, renamed_elsewhere)
