"""The package's layers (docs/contributing.md, Layout): every import of edgeq code, lazy and TYPE_CHECKING
ones included, points at the importer's own layer or one below it; nothing imports from a layer above it."""

from __future__ import annotations

import ast
from pathlib import Path

import edgeq

PACKAGE = Path(edgeq.__file__).parent

# Bottom first. A module is in the layer of its longest listed prefix.
LAYERS: list[tuple[str, ...]] = [
    ("edgeq", "edgeq.errors", "edgeq.findings", "edgeq.docs", "edgeq.agent", "edgeq.config", "edgeq.fs",
     "edgeq.text", "edgeq.unionfind"),
    ("edgeq.graph",),
    ("edgeq.report", "edgeq.zoo"),
    ("edgeq.quant",),
    ("edgeq.remote",),
    ("edgeq.pipeline",),
    ("edgeq.release",),
    ("edgeq.orchestration", "edgeq.ansible"),  # the Ansible engine runs orchestration's board steps
    ("edgeq.cli",),
]


def layer_of(module: str) -> int:
    best, found = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, found = len(p), i
    assert found >= 0, f"{module} is in no layer: add it to LAYERS (and the layout in docs/contributing.md)"
    return found


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(module: str, path: Path) -> set[str]:
    """The edgeq modules ``module`` imports, wherever in the file (relative imports resolved)."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}  # ``from edgeq import zoo`` imports a module
    modules = _modules()
    return {m for m in found if m in modules}


def test_every_module_is_in_a_layer() -> None:
    for module in _modules():
        layer_of(module)


def test_no_module_imports_from_a_layer_above_it() -> None:
    upward = []
    for module, path in _modules().items():
        mine = layer_of(module)
        for imported in _imports(module, path):
            if layer_of(imported) > mine:
                upward.append(f"{module} -> {imported}")
    assert upward == []


def test_the_agent_imports_nothing_of_edgeq() -> None:
    for module, path in _modules().items():
        if module.startswith("edgeq.agent"):
            assert {m for m in _imports(module, path) if not m.startswith("edgeq.agent")} == set(), module
