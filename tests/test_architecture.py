"""The folders are the layers (docs/architecture.md): no import up a layer, and no import cycle.

Both checks read every `import` of a trioq module anywhere in a module, at its top or inside a
function (a lazy import still runs, and still ties the two modules together), and every
`importlib.import_module("trioq....")` with a literal name (a lookup at run time is an import).
The cycle check also reads imports under `if TYPE_CHECKING:` (two modules that name each other
even for types cannot be read or moved apart); the layer check does not (a lower layer may name
a higher one's class in an annotation, as the runtime's Context names the public Client).
Importing `a.b` also imports the package `a`; that implied edge is not in the graph (every
package re-exporting its modules would read as a cycle).
"""

from __future__ import annotations

import ast
import pathlib
import re

import trioq

PACKAGE = pathlib.Path(trioq.__file__).parent
ARCHITECTURE = pathlib.Path(__file__).parent.parent / "docs" / "architecture.md"


def _layers() -> list[tuple[str, list[str]]]:
    """(layer, module path patterns) from the table in docs/architecture.md, lowest first."""
    layers = []
    for line in ARCHITECTURE.read_text().splitlines():
        match = re.fullmatch(r"\| (\w+) \| (`.+`) \|", line)
        if match:
            layers.append((match[1], re.findall(r"`trioq/([^`]+)`", match[2])))
    return layers


def _module_name(path: pathlib.Path, root: pathlib.Path = PACKAGE.parent) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if path.name == "__init__.py" else parts)


def _imports(
    path: pathlib.Path,
    modules: set[str],
    root: pathlib.Path = PACKAGE.parent,
    typing: bool = True,
) -> set[str]:
    """trioq modules `path` imports: statements anywhere (under TYPE_CHECKING too when
    `typing`) and `import_module` calls with a literal module name."""
    tree = ast.parse(path.read_text())
    typing_only = (
        set()
        if typing
        else {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for inner in ast.walk(node)
        }
    )
    name = _module_name(path, root)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            submodules = {f"{base}.{alias.name}" for alias in node.names} & modules
            found.update(submodules)
            if len(submodules) < len(node.names):  # some names come from the module itself
                found.add(base)
        elif _is_import_module_call(node):
            found.add(node.args[0].value)  # type: ignore[attr-defined]
    return {module for module in found if module in modules and module != name}


def _is_import_module_call(node: ast.AST) -> bool:
    """`importlib.import_module("literal")` or `import_module("literal")`."""
    return (
        isinstance(node, ast.Call)
        and ast.unparse(node.func).split(".")[-1] == "import_module"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def _graph(typing: bool = True) -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: _imports(path, set(paths), typing=typing) for name, path in paths.items()}


def _layer_of(module: str, layers: list[tuple[str, list[str]]]) -> int:
    path = "trioq/__init__" if module == "trioq" else module.replace(".", "/")
    for index, (_, patterns) in enumerate(layers):
        for pattern in patterns:
            stem = pattern.removesuffix(".py").removesuffix("/")
            prefix = "trioq/" + stem
            if stem.endswith("*"):
                matched = path.startswith(prefix[:-1])
            else:
                matched = path == prefix or path.startswith(prefix + "/")
            if matched:
                return index
    raise AssertionError(f"{module} is in no layer of docs/architecture.md: add it to the table")


def test_every_module_belongs_to_a_layer_and_imports_none_above_it() -> None:
    layers = _layers()
    assert [name for name, _ in layers][:2] == ["core", "sql"], "the layer table was not found"
    upward = []
    for module, imported in sorted(_graph(typing=False).items()):
        level = _layer_of(module, layers)
        for target in sorted(imported):
            if _layer_of(target, layers) > level:
                upward.append(f"{module} ({layers[level][0]}) imports {target}")
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's cycles as strongly connected components (sorted), each of several modules."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for target in graph.get(todo.pop(), ()):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        reach[start] = seen
    components = {
        tuple(sorted({module} | {other for other in reach[module] if module in reach[other]}))
        for module in graph
        if module in reach[module]
    }
    return [list(component) for component in sorted(components)]


def test_the_cycle_check_finds_a_cycle_through_several_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({**graph, "c": {"d"}}) == []


def test_the_graph_counts_lazy_type_checking_and_import_module_imports(
    tmp_path: pathlib.Path,
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "lazy.py").write_text("def f():\n    from .other import g\n")
    (package / "typing_only.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import other\n"
    )
    (package / "looked_up.py").write_text(
        "import importlib\nimportlib.import_module('pkg.other').main()\n"
    )
    modules = {"pkg.lazy", "pkg.typing_only", "pkg.looked_up", "pkg.other"}
    for name in ("lazy", "typing_only", "looked_up"):
        assert _imports(package / f"{name}.py", modules, root=tmp_path) == {"pkg.other"}, name
    assert _imports(package / "typing_only.py", modules, root=tmp_path, typing=False) == set()


def test_no_module_imports_itself_through_others() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)
