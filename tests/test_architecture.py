"""The folders are the layers (docs/architecture.md): no import up a layer."""

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


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if path.name == "__init__.py" else parts)


def _imports(path: pathlib.Path, modules: set[str]) -> set[str]:
    """trioq modules `path` imports at run time (not those under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    name = _module_name(path)
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
    return {module for module in found if module in modules and module != name}


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: _imports(path, set(paths)) for name, path in paths.items()}


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
    for module, imported in sorted(_graph().items()):
        level = _layer_of(module, layers)
        for target in sorted(imported):
            if _layer_of(target, layers) > level:
                upward.append(f"{module} ({layers[level][0]}) imports {target}")
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)
