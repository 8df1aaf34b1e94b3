"""pants.toml and BUILD files describe the real tree: every source folder is covered by a
target, every pex_binary entry point exists, every distribution is declared."""

import ast
import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SERVICES = ["databuffer", "trainer", "rollout", "scheduler"]


def build_targets() -> list[tuple[Path, str, dict]]:
    """(folder, target type, keyword args) of every target in every BUILD file."""
    targets = []
    for build in ROOT.rglob("BUILD"):
        if ".venv" in build.parts:
            continue
        tree = ast.parse(build.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                kwargs = {
                    k.arg: ast.literal_eval(k.value)
                    for k in node.keywords
                    if k.arg in ("sources", "entry_point", "name")
                }
                targets.append((build.parent, node.func.id, kwargs))
    return targets


def covered(path: Path, targets) -> bool:
    for folder, _kind, kwargs in targets:
        for pattern in kwargs.get("sources", []):
            try:
                rel = path.relative_to(folder).as_posix()
            except ValueError:
                continue
            if fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(rel, pattern.replace("**/", "")):
                return True
    return False


def test_every_source_file_is_covered_by_a_target():
    targets = build_targets()
    roots = [ROOT / "protos", ROOT / "libs", ROOT / "services", ROOT / "tests"]
    skip = {"__pycache__", "build", "dist"}
    files = [p for r in roots for p in r.rglob("*") if p.suffix in (".py", ".proto") and not skip & set(p.parts)]
    uncovered = [str(p.relative_to(ROOT)) for p in files if not covered(p, targets)]
    assert not uncovered, f"files outside every BUILD target: {uncovered[:10]}"


def test_each_service_has_a_pex_binary_with_a_real_entry_point():
    binaries = {kw["name"]: (folder, kw["entry_point"]) for folder, kind, kw in build_targets() if kind == "pex_binary"}
    assert set(binaries) == set(SERVICES)
    for _name, (folder, entry) in binaries.items():
        module = folder / Path(*entry.split(".")).with_suffix(".py")
        assert module.is_file(), f"pex_binary entry point {entry} does not exist ({module})"


def test_pants_source_roots_and_distributions():
    text = (ROOT / "pants.toml").read_text()
    for root in ("/protos", "/libs/common", "/services/*"):
        assert f'"{root}"' in text
    kinds = {(f.relative_to(ROOT).as_posix(), k) for f, k, _ in build_targets()}
    for svc in SERVICES:
        assert (f"services/{svc}", "python_distribution") in kinds
        assert (ROOT / "services" / svc / "pyproject.toml").is_file()
    assert ("protos", "protobuf_sources") in kinds
