"""Renders a Kubernetes overlay with the real `kubectl kustomize` (kustomize v5 built into kubectl),
for the deployment tests (conftest.py's `rendered` fixture, test_kustomize.py). No renderer of our own."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml


class KustomizeError(RuntimeError):
    """kubectl refused the kustomization; the message is kubectl's own."""


def kubectl() -> str | None:
    return shutil.which("kubectl")


def render(folder: Path, timeout: float = 120.0) -> list[dict]:
    """The objects `kubectl kustomize FOLDER` prints, parsed, in its order."""
    binary = kubectl()
    if binary is None:
        raise KustomizeError("kubectl is not on PATH: install kubectl (it carries kustomize) to render deploy/k8s")
    done = subprocess.run([binary, "kustomize", str(folder)], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise KustomizeError(f"kubectl kustomize {folder}: {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]
