"""The step package's subpackages import in one direction only: each from those below it, never from one above
it or from another of its own layer (the layers `meshrl/scheduler/step/__init__.py` describes). Every import
counts, the ones inside functions and under TYPE_CHECKING too, so no cycle between concerns can hide there."""

import ast
from pathlib import Path

import pytest

import meshrl.scheduler.step as step

PACKAGE = "meshrl.scheduler.step"
ROOT = Path(step.__file__).parent
# Top to bottom; the subpackages of one layer are independent of each other.
LAYERS = [("job",), ("pacing",), ("dag",), ("user",), ("scoring", "prompts")]
RANK = {name: rank for rank, layer in enumerate(LAYERS) for name in layer}


def _subpackage(module: str) -> str | None:
    """The step subpackage a dotted module name lies in, or None outside the step package."""
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        return None
    parts = module[len(PACKAGE) + 1 :].split(".")
    return parts[0] or None


def _imported(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every module or name the file imports, relative imports made absolute."""
    module = ".".join(path.relative_to(ROOT.parent.parent.parent).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module.removesuffix(".__init__")
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found += [(node.lineno, f"{base}.{alias.name}" if base == PACKAGE else base) for alias in node.names]
    return found


def _sources() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_step_module_lies_in_a_known_subpackage():
    loose = [str(p.relative_to(ROOT)) for p in _sources() if p.parent == ROOT and p.name != "__init__.py"]
    assert not loose, f"modules directly in step/: {loose}; move each into the subpackage of its concern"
    unknown = sorted({p.relative_to(ROOT).parts[0] for p in _sources() if p.parent != ROOT} - set(RANK))
    assert not unknown, f"step subpackages missing from LAYERS: {unknown}; place each in a layer of this test"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_step_modules_import_only_subpackages_below_their_own(path: Path):
    if path.parent == ROOT:
        return  # step/__init__.py: the package docstring only
    own = path.relative_to(ROOT).parts[0]
    wrong = []
    for line, name in _imported(path):
        other = _subpackage(name)
        if other is None or other == own:
            continue
        if other not in RANK or RANK[other] <= RANK[own]:
            wrong.append(f"line {line}: {name}")
    assert not wrong, (
        f"step/{own}/{path.name} imports from a step subpackage at or above its own layer "
        f"({' > '.join('|'.join(layer) for layer in LAYERS)}): {wrong}. Move the name it needs down a layer, "
        "or the module up"
    )
