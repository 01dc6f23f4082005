"""Every error code a client can receive is a constant of ``rtserve/errors.py``, named, never
spelled out elsewhere, and README.md's error table lists exactly those codes.

The AST walk over ``rtserve/`` (all modules but the catalogue itself) fails on a string
literal that stands where an error code goes:

1. the value of a keyword argument ``code=`` or ``error_code=``;
2. the argument in the position of a parameter named ``code`` of a class or function defined
   in the package (``SessionError(code, message)``, ``EngineFailure(code, message)``,
   ``OutputSink.error(code, ...)``, ``ClientError(message, code)``), the callee resolved by
   its name where every definition of that name agrees on the position; a literal counts
   when it reads like a code (one lower-case word or snake_case);
3. ``code = "..."`` in a class body (an error class's default) and ``....code == "..."``,
   ``!=``, ``in``;
4. the value of a ``"code"`` key in a dict display (hand-built error bodies and frames);
5. a literal equal to a catalogue code given as a close or end ``reason`` (keyword or the
   position of a parameter named ``reason``), or as a key or member of a table whose name
   says it is keyed by code or reason (``_HTTP_BY_CODE``, ``_CLOSE_FOR_REASON``, ...):
   reasons also include words that are not codes (``"shutdown"``), so only codes count;
6. any literal equal to an error ``type`` (``"invalid_request_error"``, ...): those strings
   mean nothing else.

Rules 1-4 catch a code that is not in the catalogue yet; 5 and 6 can only compare with it.
Metric label values (``"engine_error"`` as an outcome next to ``"busy"``) are not codes and are
not checked. Docstrings are never checked.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from rtserve import errors

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rtserve"
CATALOGUE = PACKAGE / "errors.py"

ERROR_TYPES = errors.ERROR_TYPES
CODES = (
    frozenset(value for name, value in vars(errors).items() if name.isupper() and isinstance(value, str)) - ERROR_TYPES
)
CODE_LIKE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
CODE_KEYWORDS = frozenset({"code", "error_code"})
TABLE_NAME = re.compile(r"(CODE|REASON)", re.IGNORECASE)


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != CATALOGUE:
            yield path, ast.parse(path.read_text(), str(path))


def _literals(node: ast.expr) -> Iterator[ast.Constant]:
    """The string literals ``node`` can evaluate to (``a if c else b``, ``a or b`` included)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, ast.IfExp):
        yield from _literals(node.body)
        yield from _literals(node.orelse)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            yield from _literals(value)


def _parameters(node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef, *, method: bool) -> list[str] | None:
    """Positional parameter names as a caller passes them (``self`` left out); ``None`` for a
    class that inherits its constructor (unknown here)."""
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is not None:
            return _parameters(init, method=True)
        if any("dataclass" in ast.unparse(d) for d in node.decorator_list):
            return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
        return None
    names = [a.arg for a in node.args.posonlyargs + node.args.args]
    static = any(ast.unparse(d) == "staticmethod" for d in node.decorator_list)
    return names[1:] if method and not static else names


def _positions(modules: list[tuple[Path, ast.Module]], parameter: str) -> dict[str, int]:
    """Callable name -> the position at which every definition of that name takes ``parameter``
    (a name whose definitions disagree, like ``close(code: int)`` and ``close()``, is left out)."""
    positions: dict[str, set[int | None]] = {}
    for _, tree in modules:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                candidates: list[tuple[ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef, bool]] = [(node, False)]
                candidates += [(n, True) for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
            elif isinstance(node, ast.Module):
                candidates = [(n, False) for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
            else:
                continue
            for definition, method in candidates:
                names = _parameters(definition, method=method)
                if names is None:
                    continue
                position = names.index(parameter) if parameter in names else None
                positions.setdefault(definition.name, set()).add(position)
    return {
        name: position for name, found in positions.items() if len(found) == 1 and (position := found.pop()) is not None
    }


def _docstrings(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _is_code_reference(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "code") or (
        isinstance(node, ast.Name) and node.id == "code"
    )


def _hits(tree: ast.Module, code_at: dict[str, int], reason_at: dict[str, int]) -> list[ast.Constant]:
    """The literals of one module standing where a code goes (rules 1-6), in source order."""
    hits: list[ast.Constant] = []

    def code_literal(node: ast.expr, *, code_like: bool = False) -> None:
        hits.extend(
            lit
            for lit in _literals(node)
            if not code_like or (isinstance(lit.value, str) and CODE_LIKE.fullmatch(lit.value))
        )

    def catalogue_code(node: ast.expr) -> None:
        hits.extend(lit for lit in _literals(node) if lit.value in CODES)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _callee(node) or ""
            for keyword in node.keywords:
                if keyword.arg in CODE_KEYWORDS:
                    code_literal(keyword.value)
                elif keyword.arg == "reason":
                    catalogue_code(keyword.value)
            for position, argument in enumerate(node.args):
                if position == code_at.get(name):
                    code_literal(argument, code_like=True)
                if position == reason_at.get(name):
                    catalogue_code(argument)
        elif isinstance(node, ast.ClassDef):
            for statement in node.body:
                if isinstance(statement, ast.Assign | ast.AnnAssign) and statement.value is not None:
                    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                    if any(isinstance(t, ast.Name) and t.id == "code" for t in targets):
                        code_literal(statement.value)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_code_reference(side) for side in sides):
                for side in sides:
                    code_literal(side)
                    if isinstance(side, ast.Tuple | ast.List | ast.Set):
                        for element in side.elts:
                            code_literal(element)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "code":
                    code_literal(value)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and TABLE_NAME.search(t.id) for t in targets):
                table = node.value.args[0] if isinstance(node.value, ast.Call) and node.value.args else node.value
                if isinstance(table, ast.Dict):
                    for key in table.keys:
                        if key is not None:
                            catalogue_code(key)
                elif isinstance(table, ast.Set | ast.Tuple | ast.List):
                    for element in table.elts:
                        catalogue_code(element)
        if isinstance(node, ast.Constant) and node.value in ERROR_TYPES:
            hits.append(node)
    docstrings = _docstrings(tree)
    unique = {id(hit): hit for hit in hits if id(hit) not in docstrings}
    return sorted(unique.values(), key=lambda hit: (hit.lineno, hit.col_offset))


def hand_written_codes() -> list[str]:
    """``path:line: literal`` for every string literal standing where a code goes."""
    modules = list(_modules())
    code_at = _positions(modules, "code")
    reason_at = _positions(modules, "reason")
    return [
        f"{path.relative_to(ROOT)}:{hit.lineno}: {hit.value!r}"
        for path, tree in modules
        for hit in _hits(tree, code_at, reason_at)
    ]


def test_error_codes_are_named_from_the_catalogue_not_spelled_out() -> None:
    assert hand_written_codes() == []


def test_the_walk_sees_a_code_spelled_out_in_each_place_a_code_goes(tmp_path, monkeypatch) -> None:
    """The rules above, each fed one hand-written code, so the first test cannot pass by
    walking nothing."""
    package = tmp_path / "rtserve"
    package.mkdir()
    (package / "errors.py").write_text("")
    (package / "sample.py").write_text(
        "class Refusal(Exception):\n"
        "    code = 'not_in_the_catalogue'\n"
        "    def __init__(self, code, message):\n"
        "        pass\n"
        "def end(call, reason):\n"
        "    pass\n"
        "Refusal('refused_positionally', 'a message')\n"
        "Refusal(message='m', code='refused_by_keyword')\n"
        "body = {'code': 'in_a_body', 'type': 'server_error'}\n"
        "if exc.code == 'compared': pass\n"
        "end(call, 'internal_error')\n"
        "_CLOSE_BY_CODE = {'resource_exhausted': 1013, 'not_a_code': 1000}\n"
        "Refusal('a sentence, not a code', 'x')\n"
    )
    this_module = sys.modules[__name__]
    monkeypatch.setattr(this_module, "ROOT", tmp_path)
    monkeypatch.setattr(this_module, "PACKAGE", package)
    monkeypatch.setattr(this_module, "CATALOGUE", package / "errors.py")
    assert [line.split(": ", 1)[1] for line in hand_written_codes()] == [
        "'not_in_the_catalogue'",
        "'refused_positionally'",
        "'refused_by_keyword'",
        "'in_a_body'",
        "'server_error'",
        "'compared'",
        "'internal_error'",
        "'resource_exhausted'",
    ]


def _readme_error_table() -> list[str]:
    """The codes in README.md's ``## Errors`` table (first column, one backticked code a row)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("## Errors")
    codes = []
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        match = re.match(r"\| `([a-z0-9_]+)` \|", line)
        if match:
            codes.append(match.group(1))
    return codes


def test_the_readme_error_table_lists_exactly_the_catalogue() -> None:
    table = _readme_error_table()
    assert len(table) == len(set(table)), "a code is listed twice"
    assert sorted(CODES - set(table)) == [], "codes missing from README.md's error table"
    assert sorted(set(table) - CODES) == [], "codes in README.md's error table that the catalogue lacks"
