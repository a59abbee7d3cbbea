"""The multi_gpu family's edits: what its rewrites do to a call or an import.

Each takes the node as rewritten so far and returns its replacement (the engine applies
them bottom-up); `MultiGpuRule` (`multi_gpu.py`) decides which node gets which.
`_mgm_call_fits` and `_dropped_flags` read the call `_to_parallelize` rewrites.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import libcst as cst

from kerasmgpu.migrate import nodes

_MGM = "multi_gpu_model"
_LEGACY = "kerasmgpu.legacy"
_MGM_PARAMS = ("model", "gpus", "cpu_merge", "cpu_relocation")


def _remove_statement(updated: cst.CSTNode) -> cst.RemovalSentinel:
    return cst.RemovalSentinel.REMOVE


def _mgm_call_fits(call: cst.Call) -> bool:
    bound = nodes.bind(call, _MGM_PARAMS)
    return bound is not None and "model" in bound and set(bound) <= set(_MGM_PARAMS)


def _dropped_flags(call: cst.Call) -> str:
    bound = nodes.bind(call, _MGM_PARAMS) or {}
    dropped = [name for name in ("cpu_merge", "cpu_relocation") if name in bound]
    if not dropped:
        return ""
    verb = "they only steered" if len(dropped) > 1 else "it only steered"
    return (f"; {' and '.join(dropped)} dropped: {verb} where Keras 2.3 merged the outputs "
            "and built the template, and kerasmgpu all-reduces gradients instead")


def _to_parallelize(updated: cst.CSTNode) -> cst.CSTNode:
    """`multi_gpu_model(m, gpus=G, ...)` / `make_parallel(m, n)` -> `parallelize(m, gpus=G)`."""
    assert isinstance(updated, cst.Call)
    is_mp = nodes.dotted(updated.func) == "make_parallel"
    params = ("model", "gpu_count") if is_mp else _MGM_PARAMS
    bound = nodes.bind(updated, params)
    assert bound is not None  # checked when the rewrite was decided
    gpus = bound.get("gpu_count" if is_mp else "gpus")
    args = [bound["model"].with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)]
    if gpus is not None:
        args.append(nodes.as_keyword(gpus, "gpus"))
    return nodes.with_args(updated, args, func=nodes.attr_chain("kerasmgpu.parallelize"))


def _swap_mgm_module(updated: cst.CSTNode) -> cst.CSTNode:
    """`from keras.utils import multi_gpu_model` -> `from kerasmgpu.legacy import ...`.

    With other names on the line, they stay and `_split_legacy_import` adds the
    kerasmgpu import after it; the marker is the module left on multi_gpu_model alone.
    """
    assert isinstance(updated, cst.ImportFrom) and not isinstance(updated.names, cst.ImportStar)
    names = list(updated.names)
    if all(nodes.dotted(alias.name) == _MGM for alias in names):
        return updated.with_changes(module=nodes.attr_chain(_LEGACY))
    return updated


def _split_legacy(small: cst.BaseSmallStatement) -> Tuple[cst.BaseSmallStatement,
                                                          Optional[cst.ImportFrom]]:
    if not isinstance(small, cst.ImportFrom) or isinstance(small.names, cst.ImportStar):
        return small, None
    if nodes.module_of(small) == _LEGACY:
        return small, None
    names = list(small.names)
    moved = [alias for alias in names if nodes.dotted(alias.name) == _MGM]
    if not moved:
        return small, None
    kept = [alias for alias in names if nodes.dotted(alias.name) != _MGM]
    if nodes.dotted(names[-1].name) == _MGM:
        # The last name went away: its comma (absent, or a trailing one before `)`) moves
        # to the new last name so the layout of a parenthesized import survives.
        kept[-1] = kept[-1].with_changes(comma=names[-1].comma)
    added = cst.ImportFrom(
        module=nodes.attr_chain(_LEGACY),
        names=[alias.with_changes(comma=cst.MaybeSentinel.DEFAULT) for alias in moved],
    )
    return small.with_changes(names=kept), added


def _split_legacy_import(updated: cst.CSTNode) -> cst.CSTNode | cst.FlattenSentinel:
    assert isinstance(updated, cst.SimpleStatementLine)
    body: List[cst.BaseSmallStatement] = []
    added: List[cst.BaseStatement] = []
    for small in updated.body:
        kept, extra = _split_legacy(small)
        body.append(kept)
        if extra is not None:
            added.append(cst.SimpleStatementLine(body=[extra]))
    if not added:
        return updated
    return cst.FlattenSentinel([updated.with_changes(body=body), *added])


def _split_legacy_suite(updated: cst.CSTNode) -> cst.CSTNode:
    # `if x: from keras.utils import a, multi_gpu_model` has no line to add after,
    # so the new import joins the suite after a semicolon.
    assert isinstance(updated, cst.SimpleStatementSuite)
    body: List[cst.BaseSmallStatement] = []
    added: List[cst.BaseSmallStatement] = []
    for small in updated.body:
        kept, extra = _split_legacy(small)
        body.append(kept)
        if extra is not None:
            added.append(extra)
    return updated.with_changes(body=[*body, *added]) if added else updated


def _drop_gone_import(updated: cst.CSTNode, module: str) -> cst.CSTNode | cst.RemovalSentinel:
    """Remove the alias that imports `module`; `import a.b.gone` becomes `import a`."""
    if isinstance(updated, cst.Import):
        kept: List[cst.ImportAlias] = []
        for alias in updated.names:
            name = nodes.dotted(alias.name) or ""
            if name != module:
                kept.append(alias)
            elif alias.asname is None:
                kept.append(alias.with_changes(name=cst.Name(name.split(".")[0])))
        if not kept:
            return cst.RemovalSentinel.REMOVE
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(names=kept)
    assert isinstance(updated, cst.ImportFrom) and not isinstance(updated.names, cst.ImportStar)
    leaf = module.rsplit(".", 1)[1]
    names = [alias for alias in updated.names if nodes.dotted(alias.name) != leaf]
    if not names:
        return cst.RemovalSentinel.REMOVE
    names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return updated.with_changes(names=names)
