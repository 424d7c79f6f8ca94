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
    "fxquant.__main__": 6, "fxquant.errors": 0, "fxquant._version": 0, "fxquant.planted": 0,
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


# -- the house and the lab: examples, experiments and benchmarks stand on the public API --

ROOT = PACKAGE.parent
LAB = ("examples", "experiments", "benchmarks")
#: what each part of the lab may import of the others (the library imports none of them)
LAB_IMPORTS = {"examples": set(), "experiments": {"experiments"},
               "benchmarks": {"benchmarks", "experiments"}}
#: test folders that test the lab; every other test is a library test
LAB_TESTS = {"examples", "experiments", "benchmarks"}


def _lab_files() -> dict[str, Path]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
            for part in LAB for p in sorted((ROOT / part).rglob("*.py"))}


def _top(name: str) -> str:
    return name.split(".")[0]


def test_the_library_imports_nothing_of_the_lab():
    """fxquant imports no example, experiment or benchmark, and names none of their command
    lines or scripts (a recipe's commands are in the docs, beside its results)."""
    wrong = [f"{module}:{line} imports {target}" for module, path in _modules().items()
             for target, _, line in _imports(module, path) if _top(target) in LAB]
    named = [f"{module}: {needle!r}" for module, path in _modules().items()
             for needle in ("examples/", "experiments/", "benchmarks/", "python examples",
                            "-m experiments", "-m benchmarks") if needle in path.read_text()]
    assert not wrong + named, "\n".join(wrong + named)


def _public(target: str, name: str) -> bool:
    """Whether ``from target import name`` (``name`` empty: ``import target``) takes a public
    name of fxquant: no private module on the way, and a name its module exports."""
    if any(part.startswith("_") for part in target.split(".")):
        return False
    if not name or name == "*":
        return True
    module = importlib.import_module(target)
    if isinstance(getattr(module, name, None), type(module)):  # a public submodule
        return not name.startswith("_")
    return name in getattr(module, "__all__", ())


def test_the_lab_uses_only_the_public_api():
    """examples/, experiments/ and benchmarks/ import only names fxquant exports (a public
    module's ``__all__``), reach no ``fxquant._private`` attribute, and import each other
    only downward: benchmarks -> experiments; examples import neither."""
    wrong = []
    for module, path in _lab_files().items():
        tree = ast.parse(path.read_text())
        for target, name, line in _imports(module, path):
            if _top(target) == "fxquant" and not _public(target, name):
                wrong.append(f"{module}:{line} imports {target}.{name} (not public)")
            if _top(target) in LAB and _top(target) not in LAB_IMPORTS[_top(module)]:
                wrong.append(f"{module}:{line} imports {target} (the lab imports downward)")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                    not node.attr.startswith("__") and ast.unparse(node.value).startswith(
                        "fxquant"):
                wrong.append(f"{module}:{node.lineno} reads {ast.unparse(node)} (private)")
    assert not wrong, "\n".join(wrong)


def test_the_lab_edits_no_import_path():
    """No script puts a folder on ``sys.path`` to import the repository's code: the lab is
    run from the repository root (``python -m experiments.NAME``). The one exception loads
    the Degree-Quant reference checkout, code from outside this repository."""
    allowed = {"benchmarks.dq_reference_support"}
    wrong = [f"{module}:{node.lineno}" for module, path in _lab_files().items()
             if module not in allowed for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and ast.unparse(node) == "sys.path"]
    assert not wrong, "\n".join(wrong)


def test_library_tests_import_nothing_of_the_lab():
    """Tests of the library import no example, experiment or benchmark (the lab's tests
    live in tests/examples, tests/experiments and tests/benchmarks)."""
    tests = ROOT / "tests"
    wrong = []
    for path in sorted(tests.rglob("*.py")):
        rel = path.relative_to(tests)
        if rel.parts[0] in LAB_TESTS:
            continue
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        wrong += [f"{module}:{line} imports {target}" for target, _, line in
                  _imports(module, path) if _top(target) in LAB]
        wrong += [f"{module}: names {folder}/" for folder in LAB
                  if f"ROOT / \"{folder}\"" in path.read_text()]
    assert not wrong, "\n".join(wrong)
