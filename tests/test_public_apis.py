"""Libraries are used through their public APIs only (SPEC §10): no ``obj._private`` of theirs.

Every module of ``webapp/`` is parsed; an attribute whose name starts with one
underscore (``x._name``, or ``getattr``/``setattr``/``hasattr``/``delattr`` of
``x`` and ``"_name"``) must be one the project defines itself -- a function,
class, variable, parameter or attribute it assigns. Anything else belongs to
a library, whose next release may rename it without notice (as aiosqlite's
``Connection._execute`` and ``_conn`` could): the failure this prevents is an
upgrade that breaks the app, or quietly changes what it does, with no
deprecation warning first.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "webapp"

# Public by the library's own documentation despite the underscore: namedtuple's
# methods and fields, and enum's hooks.
DOCUMENTED = {"_replace", "_asdict", "_fields", "_field_defaults", "_make", "_missing_"}
DOCUMENTED |= {"_value_", "_name_", "_generate_next_value_", "_ignore_"}
REFLECTION = {"getattr", "setattr", "hasattr", "delattr"}


def modules(package: Path = PACKAGE) -> dict[str, ast.Module]:
    """Every module of ``package``, parsed, keyed by its path relative to the package."""
    return {
        str(path.relative_to(package.parent)): ast.parse(path.read_text(), str(path))
        for path in sorted(package.rglob("*.py"))
        if "_assets" not in path.parts
    }


def defined_names(trees: Iterable[ast.Module]) -> set[str]:
    """Names the project defines: what it declares, binds, or assigns as an attribute."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    names.add(node.attr)  # its own objects' attributes
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.Call) and _called(node) == "setattr":
                text = _constant_name(node)
                if text is not None and node.args and _is_self(node.args[0]):
                    names.add(text)  # object.__setattr__(self, "_x", ...) in frozen classes
    return names


def private_uses(trees: Mapping[str, ast.Module]) -> list[str]:
    """``module:line: what`` for each use of a private attribute the project never defines."""
    own = defined_names(trees.values()) | DOCUMENTED
    found: list[str] = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.Call) and _called(node) in REFLECTION:
                name = _constant_name(node)
            if name is not None and _private(name) and name not in own:
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _called(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):  # object.__setattr__ and the like
        return func.attr.strip("_")
    return func.id if isinstance(func, ast.Name) else ""


def _constant_name(call: ast.Call) -> str | None:
    if len(call.args) >= 2 and isinstance(call.args[1], ast.Constant):
        value = call.args[1].value
        return value if isinstance(value, str) else None
    return None


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def test_nothing_in_webapp_reads_or_writes_a_librarys_private_attribute() -> None:
    problems = private_uses(modules())
    assert problems == [], "use the library's public API instead:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "line",
    [
        "rows = db._conn.execute('SELECT 1')",
        "result = await db._execute(fn, conn)",
        "thread = getattr(pending, '_thread', None)",
        "pending._thread.daemon = True",
        "setattr(client, '_mounts', {})",
        "if hasattr(response, '_content'): pass",
    ],
)
def test_the_scan_finds_a_private_attribute_added_to_the_project(line: str) -> None:
    # The same scan over the real package with one more module: it must fail.
    trees = modules()
    trees["webapp/added.py"] = ast.parse(line)
    assert private_uses(trees) == [f"webapp/added.py:1: {_shown(line)}"]


def _shown(line: str) -> str:
    """The expression the scan names for ``line``: the attribute, or the reflective call."""
    tree = ast.parse(line)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called(node) in REFLECTION:
            return ast.unparse(node)
        if isinstance(node, ast.Attribute) and _private(node.attr):
            return ast.unparse(node)
    raise AssertionError(f"no private attribute in {line!r}")


def test_the_projects_own_private_names_are_not_flagged() -> None:
    source = """
class Store:
    def __init__(self) -> None:
        self._db = None

    def _connection(self) -> None: ...

def use(store: Store) -> None:
    store._connection()
    print(store._db, getattr(store, "_db"))
"""
    assert private_uses({"webapp/own.py": ast.parse(source)}) == []
