"""Small, pure helpers over libcst nodes: names, strings, and call arguments.

Argument lists are rebuilt with `with_args`, which keeps each kept argument's own comma and
spacing (a call laid out one argument per line stays that way) and the call's trailing
comma, whichever arguments were dropped, renamed or added.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Sequence

import libcst as cst


def dotted(node: Optional[cst.CSTNode]) -> Optional[str]:
    """`a.b.c` for a Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def module_of(node: cst.ImportFrom) -> str:
    """`keras.layers` for `from keras.layers import ...`; `..utils` for a relative one."""
    dots = "." * len(node.relative)
    return dots + (dotted(node.module) or "") if node.module else dots


def expr(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def attr_chain(dotted_name: str) -> cst.BaseExpression:
    """The expression `a.b.c` from its dotted text."""
    parts = dotted_name.split(".")
    node: cst.BaseExpression = cst.Name(parts[0])
    for part in parts[1:]:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def string_value(node: Optional[cst.CSTNode]) -> Optional[str]:
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def number_value(node: Optional[cst.CSTNode]) -> Optional[float]:
    """The value of a numeric literal (`1e-6`, `-0.5`, `3`), else None."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = number_value(node.expression)
        return None if inner is None else -inner
    if isinstance(node, (cst.Integer, cst.Float)):
        return float(node.evaluated_value)
    return None


def is_docstring(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def holds_import(stmt: cst.CSTNode) -> bool:
    """Whether a statement is an import line, or an if/try whose branches hold one.

    `try: import keras / except ImportError: ...` counts: an inserted import must come
    after such a block, not before the name it sits beside.
    """
    if isinstance(stmt, cst.SimpleStatementLine):
        return any(isinstance(small, (cst.Import, cst.ImportFrom)) for small in stmt.body)
    blocks: List[cst.BaseSuite] = []
    if isinstance(stmt, cst.If):
        blocks.append(stmt.body)
        if isinstance(stmt.orelse, cst.If):  # elif
            if holds_import(stmt.orelse):
                return True
        elif stmt.orelse is not None:
            blocks.append(stmt.orelse.body)
    elif isinstance(stmt, cst.Try):
        blocks.append(stmt.body)
        blocks.extend(handler.body for handler in stmt.handlers)
        if stmt.orelse is not None:
            blocks.append(stmt.orelse.body)
    for block in blocks:
        if isinstance(block, cst.IndentedBlock):
            if any(holds_import(inner) for inner in block.body):
                return True
        elif isinstance(block, cst.SimpleStatementSuite):
            if any(isinstance(small, (cst.Import, cst.ImportFrom)) for small in block.body):
                return True
    return False


# --- call arguments ------------------------------------------------------------------


def has_star(call: cst.Call) -> bool:
    return any(arg.star for arg in call.args)


def keyword(arg: cst.Arg) -> Optional[str]:
    return arg.keyword.value if arg.keyword is not None else None


def bind(call: cst.Call, params: Sequence[str]) -> Optional[Dict[str, cst.Arg]]:
    """The call's arguments by parameter name (positionals in `params` order).

    None when they cannot be matched: `*args`/`**kwargs`, or more positionals than names.
    Keywords that are not in `params` are kept under their own name.
    """
    bound: Dict[str, cst.Arg] = {}
    position = 0
    for arg in call.args:
        if arg.star:
            return None
        name = keyword(arg)
        if name is None:
            if position >= len(params):
                return None
            name = params[position]
            position += 1
        bound[name] = arg
    return bound


def kwarg(name: str, value: cst.BaseExpression) -> cst.Arg:
    """`name=value`, spaced as Keras code usually is (no spaces around `=`)."""
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        ),
    )


def as_keyword(arg: cst.Arg, name: str) -> cst.Arg:
    """`arg` passed as `name=...` (renaming a keyword or naming a positional)."""
    if arg.keyword is not None:
        return arg.with_changes(keyword=cst.Name(name))
    return kwarg(name, arg.value).with_changes(comma=arg.comma)


def with_args(call: cst.Call, args: Sequence[cst.Arg],
              func: Optional[cst.BaseExpression] = None) -> cst.Call:
    """`call` with these arguments (and function), commas made consistent."""
    trailing = call.args[-1].comma if call.args else cst.MaybeSentinel.DEFAULT
    fixed: List[cst.Arg] = []
    for index, arg in enumerate(args):
        last = index == len(args) - 1
        if last:
            fixed.append(arg.with_changes(comma=trailing))
        elif isinstance(arg.comma, cst.MaybeSentinel):
            fixed.append(arg.with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))))
        else:
            fixed.append(arg)
    changes: Dict[str, object] = {"args": _keep_comments(call.args, fixed)}
    if func is not None:
        changes["func"] = func
    return call.with_changes(**changes)


def _comment_lines(arg: cst.Arg) -> List[cst.EmptyLine]:
    """The comments in the whitespace after an argument (and its comma), as lines."""
    comma = arg.comma
    lines: List[cst.EmptyLine] = []
    for space in (arg.whitespace_after_arg,
                  comma.whitespace_after if isinstance(comma, cst.Comma) else None):
        if not isinstance(space, cst.ParenthesizedWhitespace):
            continue
        if space.first_line.comment is not None:  # `workers=4,  # four`: a line of its own
            lines.append(cst.EmptyLine(indent=space.indent, whitespace=space.last_line,
                                       comment=space.first_line.comment))
        lines.extend(line for line in space.empty_lines if line.comment is not None)
    return lines


def _keep_comments(old: Sequence[cst.Arg], new: List[cst.Arg]) -> List[cst.Arg]:
    """`new` with every comment line of `old` that it lost (with a dropped argument, or a
    comma made the call's last) put back after the argument that preceded it."""
    kept = {line.comment.value for arg in new for line in _comment_lines(arg)
            if line.comment is not None}
    index_of = {id(arg.value): i for i, arg in enumerate(new)}
    result = list(new)
    holder = None  # the new argument the comments of the old ones seen so far follow
    for arg in old:
        holder = index_of.get(id(arg.value), holder)
        lost = [line for line in _comment_lines(arg)
                if line.comment is not None and line.comment.value not in kept]
        if not lost:
            continue
        at = len(result) - 1 if holder is None else holder
        if at < 0:
            continue  # no argument left to put them after
        result[at] = _with_lines_after(result[at], lost, last=at == len(result) - 1)
        kept.update(line.comment.value for line in lost if line.comment is not None)
    return result


def _with_lines_after(arg: cst.Arg, lines: List[cst.EmptyLine], last: bool) -> cst.Arg:
    comma = arg.comma
    space = comma.whitespace_after if isinstance(comma, cst.Comma) else None
    if isinstance(space, cst.ParenthesizedWhitespace) and isinstance(comma, cst.Comma):
        space = space.with_changes(empty_lines=[*space.empty_lines, *lines])
        return arg.with_changes(comma=comma.with_changes(whitespace_after=space))
    if not last:
        return arg  # a one-line call: no line to put a comment on
    after = arg.whitespace_after_arg
    if isinstance(after, cst.ParenthesizedWhitespace):
        return arg.with_changes(whitespace_after_arg=after.with_changes(
            empty_lines=[*after.empty_lines, *lines]))
    # The closing parenthesis moves to a line of its own, below the comments.
    return arg.with_changes(whitespace_after_arg=cst.ParenthesizedWhitespace(
        empty_lines=lines, indent=True, last_line=cst.SimpleWhitespace("")))


def drop_args(call: cst.Call, names: Sequence[str]) -> cst.Call:
    """`call` without its keyword arguments named in `names`."""
    kept = [arg for arg in call.args if keyword(arg) not in names]
    return with_args(call, kept) if len(kept) != len(call.args) else call


def rename_kwargs(call: cst.Call, renames: Dict[str, str]) -> cst.Call:
    """`call` with keyword arguments renamed (`lr=` -> `learning_rate=`)."""
    args = [as_keyword(arg, renames[keyword(arg) or ""]) if keyword(arg) in renames else arg
            for arg in call.args]
    return call.with_changes(args=args)


def kwarg_value(call: cst.Call, name: str) -> Optional[cst.BaseExpression]:
    for arg in call.args:
        if keyword(arg) == name:
            return arg.value
    return None


def module_bindings(module: cst.Module) -> Dict[str, str]:
    """Names bound at module level to modules: {"tf": "tensorflow", "K": "keras.backend"}."""
    bound: Dict[str, str] = {}
    for small in top_level_imports(module):
        if isinstance(small, cst.Import):
            for alias in small.names:
                full = dotted(alias.name) or ""
                if alias.asname is not None:
                    bound[dotted(alias.asname.name) or ""] = full
                else:
                    bound[full.split(".")[0]] = full.split(".")[0]
        elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            base = module_of(small)
            if not base or base.startswith("."):
                continue
            for alias in small.names:
                name = dotted(alias.name) or ""
                local = dotted(alias.asname.name) if alias.asname else name
                bound[local or name] = f"{base}.{name}"
    return bound


def top_level_imports(module: cst.Module) -> Iterator[cst.BaseSmallStatement]:
    """Import statements at module level, also inside top-level if/try blocks."""
    for stmt in module.body:
        yield from imports_in(stmt)


def imports_in(stmt: cst.CSTNode) -> Iterator[cst.BaseSmallStatement]:
    if isinstance(stmt, cst.SimpleStatementLine):
        yield from (s for s in stmt.body if isinstance(s, (cst.Import, cst.ImportFrom)))
    elif isinstance(stmt, (cst.If, cst.Try)):
        blocks: List[cst.BaseSuite] = [stmt.body]
        if isinstance(stmt, cst.Try):
            blocks.extend(handler.body for handler in stmt.handlers)
        for block in blocks:
            if isinstance(block, cst.IndentedBlock):
                for inner in block.body:
                    yield from imports_in(inner)
