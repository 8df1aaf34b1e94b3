"""Generates the Python gRPC code and type stubs for every proto under protos/.

The contracts live in protos/meshrl/<service>/v1/*.proto (proto package meshrl.<service>.v1);
the generated modules land in libs/common/meshrl/api/<service>/v1/ so that every service
imports them as `meshrl.api.<service>.v1`. Run with --check to fail when the committed
code is stale (used by the test suite).
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT_ROOT = ROOT / "libs" / "common" / "meshrl" / "api"
IMPORT_RE = re.compile(r"^from meshrl\.(\w+)\.v1 import", re.MULTILINE)


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def generate(dest: Path) -> None:
    """Compiles every proto into `dest` (laid out like OUT_ROOT)."""
    from grpc_tools import protoc  # imported late: only the generator needs grpcio-tools

    with tempfile.TemporaryDirectory() as tmp:
        include = Path(protoc.__file__).parent / "_proto"
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *[str(p.relative_to(PROTO_ROOT)) for p in proto_files()],
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed: see the errors above (file:line: message)")
        generated = Path(tmp) / "meshrl"
        for path in sorted(generated.rglob("*")):
            if path.is_dir():
                continue
            target = dest / path.relative_to(generated)
            target.parent.mkdir(parents=True, exist_ok=True)
            text = IMPORT_RE.sub(r"from meshrl.api.\1.v1 import", path.read_text())
            target.write_text(text)
        for package in [dest, *[d for d in dest.rglob("*") if d.is_dir()]]:
            (package / "__init__.py").touch()


def stale_files(expected: Path, actual: Path) -> list[str]:
    names = {p.relative_to(expected) for p in expected.rglob("*") if p.is_file()}
    names |= {p.relative_to(actual) for p in actual.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    return sorted(
        str(n)
        for n in names
        if not (expected / n).exists()
        or not (actual / n).exists()
        or not filecmp.cmp(expected / n, actual / n, shallow=False)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed generated code is stale")
    args = parser.parse_args(argv)
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp))
            stale = stale_files(Path(tmp), OUT_ROOT)
        if stale:
            print("generated code is stale; run `python scripts/gen_protos.py`:", *stale, sep="\n  ")
            return 1
        print("generated code is up to date")
        return 0
    shutil.rmtree(OUT_ROOT, ignore_errors=True)
    generate(OUT_ROOT)
    print(f"generated {len(proto_files())} protos into {OUT_ROOT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
