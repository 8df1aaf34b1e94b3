"""The contracts pass buf's lint (STANDARD, with the exceptions buf.yaml explains) and have no
breaking change against the previous release; the check really fails on a breaking change.
buf comes from the npm registry through npx (scripts/check_protos_buf.sh): ~2-3 s a run once cached."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from _deploy_lib import ROOT

SCRIPT = ROOT / "scripts" / "check_protos_buf.sh"
needs_npx = pytest.mark.skipif(shutil.which("npx") is None, reason="npx (Node.js) is not installed here")


def _run(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(root / "scripts" / SCRIPT.name), *args], capture_output=True, text=True, timeout=300
    )


def test_buf_config_covers_the_protos_folder():
    config = yaml.safe_load((ROOT / "buf.yaml").read_text())
    assert config["version"] == "v2"
    assert [m["path"] for m in config["modules"]] == ["protos"]
    assert config["lint"]["use"] == ["STANDARD"] and config["breaking"]["use"] == ["FILE"]
    for path in config["lint"]["ignore_only"]["ENUM_VALUE_PREFIX"]:
        assert (ROOT / path).is_file(), f"buf.yaml ignores {path}, which does not exist"
    assert (ROOT / "protos" / "buf-image.binpb").is_file(), "the previous release's descriptor image"


@needs_npx
def test_protos_pass_lint_and_breaking_checks():
    result = _run(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "lint passed" in result.stdout and "no breaking changes" in result.stdout


@needs_npx
def test_a_breaking_change_is_caught(tmp_path):
    for name in ("buf.yaml", "protos", "scripts"):
        source = ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, tmp_path / name)
    keys = tmp_path / "protos" / "meshrl" / "common" / "v1" / "keys.proto"
    text = keys.read_text()
    assert "int64 step = 2;" in text
    keys.write_text(text.replace("int64 step = 2;", "int32 step = 2;"))
    result = _run(tmp_path)  # no git here: the check falls back to protos/buf-image.binpb
    assert result.returncode != 0
    assert 'changed type from "int64" to "int32"' in result.stdout + result.stderr
