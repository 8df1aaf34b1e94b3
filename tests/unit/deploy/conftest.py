"""Fixtures of the deployment tests: the port table (deploy/ports.yaml) and every Kubernetes overlay
rendered by `kubectl kustomize` (_kustomize.py) from a copy of deploy/ holding placeholder
secrets (the real ones are never in git)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

from _deploy_lib import DEPLOY, OVERLAYS, SECRET_FILES  # noqa: E402
from _kustomize import kubectl, render  # noqa: E402


@pytest.fixture(scope="session")
def ports() -> dict:
    return yaml.safe_load((DEPLOY / "ports.yaml").read_text())


@pytest.fixture(scope="session")
def deploy_copy(tmp_path_factory) -> Path:
    """A copy of deploy/ with placeholder secrets where gen-dev-secrets.sh would put real ones."""
    dest = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY, dest, ignore=shutil.ignore_patterns("secrets", "__pycache__"))
    base_secrets = dest / "k8s" / "base" / "secrets"
    base_secrets.mkdir()
    for name, text in SECRET_FILES.items():
        (base_secrets / name).write_text(text)
    external = dest / "k8s" / "overlays" / "external-redis" / "secrets"
    external.mkdir()
    shutil.copy(
        DEPLOY / "k8s" / "overlays" / "external-redis" / "secrets" / "redis.env.example", external / "redis.env"
    )
    return dest


@pytest.fixture(scope="session")
def rendered(deploy_copy) -> dict[str, list[dict]]:
    """overlay ("base", "overlays/cpu", ...) -> the objects `kubectl kustomize` prints for it."""
    if kubectl() is None:
        pytest.skip("kubectl is not installed: the manifests are rendered by `kubectl kustomize`")
    return {name: render(deploy_copy / "k8s" / name) for name in OVERLAYS}
