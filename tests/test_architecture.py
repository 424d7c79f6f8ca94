"""The walls of the package: imports flow one way, no private name crosses a module, no
public name shadows a module, and the two wings never import each other."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import fxquant

PACKAGE = Path(fxquant.__file__).resolve().parent
#: Import layers, lowest first: a module may import its own layer and those below.
LAYERS = {
    "fxquant.formats": 0, "fxquant.modes": 0, "fxquant._ops": 1, "fxquant.fx": 2,
    "fxquant.quant": 3, "fxquant.linter": 3, "fxquant.datasets": 0, "fxquant._safe_path": 0,
    "fxquant.pipeline": 4, "fxquant.testing": 4, "fxquant.execution": 4,
    "fxquant.recipes": 5, "fxquant.cli": 5,
    "fxquant.__main__": 6, "fxquant.errors": 0, "fxquant._version": 0,
    "fxquant": 6,
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _layer(module: str) -> int:
    best = max((k for k in LAYERS if module == k or module.startswith(k + ".")), key=len)
    return LAYERS[best]


def _imports(module: str, path: Path) -> list[tuple[str, str, int]]:
    """(imported module, imported name or '', line) for every import, function-level too."""
    out = []
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out += [(base, a.name, node.lineno) for a in node.names]
    return out


def test_imports_flow_down_and_wings_do_not_meet():
    """formats/modes -> _ops -> fx -> quant | linter -> pipeline, execution -> cli /
    __init__."""
    modules = _modules()
    wrong = []
    for module, path in modules.items():
        for target, name, line in _imports(module, path):
            full = f"{target}.{name}" if f"{target}.{name}" in modules else target
            if not full.startswith("fxquant") or full == module or module == "fxquant":
                continue
            if _layer(full) > _layer(module):
                wrong.append(f"{module}:{line} imports {full} (a higher layer)")
            wings = {module.split(".")[1] if "." in module else "", full.split(".")[1]
                     if "." in full else ""}
            if wings == {"quant", "linter"}:
                wrong.append(f"{module}:{line} imports {full} (the wings never meet)")
    assert not wrong, "\n".join(wrong)


def test_no_private_name_crosses_a_module():
    modules = _modules()
    wrong = [f"{module}:{line} imports {target}.{name}"
             for module, path in modules.items()
             for target, name, line in _imports(module, path)
             if target.startswith("fxquant") and name.startswith("_") and not name.startswith("__")
             and f"{target}.{name}" not in modules and target != module]
    assert not wrong, "\n".join(wrong)


def test_no_public_name_shadows_a_module():
    """`fxquant.quant.summary` is the function, and no module is hidden behind a name."""
    shadowed = []
    for info in pkgutil.walk_packages(fxquant.__path__, "fxquant."):
        if info.name.endswith("__main__"):
            continue
        parent_name, _, child = info.name.rpartition(".")
        parent = importlib.import_module(parent_name)
        module = importlib.import_module(info.name)
        if getattr(parent, child) is not module:
            shadowed.append(f"{parent_name}.{child}")
    assert not shadowed


def test_op_arguments_are_read_by_name_in_one_place():
    """Only _ops knows the ops' argument layout: nobody indexes `inputs[9]` / `args[4]` of
    an fxquant op, and the op signatures are the schemas'."""
    from fxquant._ops import quantize, truncate

    for module in (truncate, quantize):
        assert list(module.ARGS) == list(module.SIGNATURE.parameters)
    offenders = []
    for module, path in _modules().items():
        if module.startswith("fxquant._ops"):
            continue
        text = path.read_text()
        for needle in ("inputs[", "[None] * 10", "args[9]", "args[4]"):
            if needle in text:
                offenders.append(f"{module}: {needle}")
    assert not offenders
