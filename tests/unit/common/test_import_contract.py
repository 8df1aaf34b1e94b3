"""The import contract the design rests on (DESIGN.md, style rule 1), checked on every product file: no service
imports another service's package, and libs/common (meshrl.common, meshrl.api) imports no service. Services
meet only through protos/ and libs/common. Every import counts, a late one inside a function too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SERVICES = ("scheduler", "trainer", "rollout", "databuffer")
LIBS = ("common", "api")


def _imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in `path`, relative ones resolved against the file's package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom):  # relative: resolved to the file's own package, meshrl.<pkg>...
            parts = path.parts
            start = len(parts) - 1 - parts[::-1].index("meshrl")
            found.append((node.lineno, ".".join(parts[start:-1])))
    return found


def _owner(module: str) -> str | None:
    """The meshrl package a module belongs to (`meshrl.trainer.core` -> trainer), None outside meshrl."""
    parts = module.split(".")
    return parts[1] if parts[0] == "meshrl" and len(parts) > 1 else None


def _product_files(owner: str) -> list[Path]:
    base = ROOT / ("libs/common" if owner in LIBS else f"services/{owner}") / "meshrl" / owner
    return sorted(base.rglob("*.py"))


def _violations(owner: str, allowed: set[str]) -> list[str]:
    out = []
    for path in _product_files(owner):
        for line, module in _imported(path):
            other = _owner(module)
            if other is not None and other not in allowed:
                out.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return out


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_only_itself_and_libs_common(service):
    assert _product_files(service), f"no files under services/{service}: the contract would check nothing"
    assert _violations(service, {service, *LIBS}) == [], (
        f"meshrl.{service} imports another service's package; move what both need to libs/common "
        "or call it over its proto"
    )


@pytest.mark.parametrize("lib", LIBS)
def test_libs_common_imports_no_service(lib):
    assert _product_files(lib)
    assert _violations(lib, set(LIBS)) == [], "libs/common is below every service: it may import none of them"


def test_the_check_sees_a_late_cross_service_import(tmp_path):
    """The checker itself: an import inside a function, and a relative one, are both seen and attributed."""
    pkg = tmp_path / "meshrl" / "rollout"
    pkg.mkdir(parents=True)
    (pkg / "bad.py").write_text("def f():\n    from meshrl.trainer import core\n\nfrom . import types\n")
    assert sorted((line, _owner(m)) for line, m in _imported(pkg / "bad.py")) == [(2, "trainer"), (4, "rollout")]
