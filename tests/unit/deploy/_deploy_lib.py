"""Constants and helpers shared by the deployment tests (tests/unit/deploy/test_*.py); conftest.py
puts this folder and deploy/tools on sys.path."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
SERVICES = ("scheduler", "databuffer", "trainer", "rollout")
GPU_SERVICES = ("trainer", "rollout")
OVERLAYS = ("base", "overlays/cpu", "overlays/gpu", "overlays/external-redis")
# What deploy/gen-dev-secrets.sh writes, and what the base kustomization and compose read.
SECRET_FILES = {
    "auth-token": "0123456789abcdef\n",
    "ca.crt": "-----BEGIN CERTIFICATE-----\nplaceholder-ca\n-----END CERTIFICATE-----\n",
    "tls.crt": "-----BEGIN CERTIFICATE-----\nplaceholder\n-----END CERTIFICATE-----\n",
    "tls.key": "-----BEGIN PRIVATE KEY-----\nplaceholder\n-----END PRIVATE KEY-----\n",
    "redis-auth.conf": "requirepass placeholder\n",
    "redis.env": "MESHRL_REDIS__URL=redis://:placeholder@meshrl-redis:6379/0\n",
    "registry.env": "MESHRL_REGISTRY__REDIS_URL=redis://:placeholder@meshrl-redis:6379/0\n",
}
COMPOSE_ONLY_SECRETS = {"registry.env"}


def find(resources: list[dict], kind: str, name: str) -> dict:
    matches = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def of_kind(resources: list[dict], kind: str) -> list[dict]:
    return [r for r in resources if r["kind"] == kind]


def pod_spec(resource: dict) -> dict:
    return resource["spec"]["template"]["spec"]
