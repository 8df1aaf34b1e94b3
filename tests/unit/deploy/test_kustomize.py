"""Every Kubernetes overlay of deploy/k8s renders with `kubectl kustomize` and validates offline
against the Kubernetes JSON schemas (kubernetes-validate, strict: unknown fields are errors); each
overlay does what it says; a broken kustomization is refused by kustomize with its own message."""

from __future__ import annotations

import base64
import shutil

import kubernetes_validate
import pytest
import yaml
from _deploy_lib import DEPLOY, GPU_SERVICES, OVERLAYS, SERVICES, find, of_kind, pod_spec
from _kustomize import KustomizeError, kubectl, render

# The oldest Kubernetes we support (native gRPC probes are GA since 1.27) and the newest schemas shipped.
K8S_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_manifest_validates_against_the_kubernetes_schemas(rendered, overlay):
    failures = []
    for resource in rendered[overlay]:
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(resource, version, strict=True)
            except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as exc:
                failures.append(f"{resource['kind']}/{resource['metadata']['name']} @ {version}: {exc}")
    assert not failures, "\n".join(failures)


def test_the_schema_check_rejects_a_broken_manifest(rendered):
    deployment = yaml.safe_load(yaml.safe_dump(find(rendered["base"], "Deployment", "meshrl-trainer")))
    pod_spec(deployment)["containers"][0]["readinessProbe"]["grpc"]["prot"] = 50062  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


def test_base_has_what_the_issue_asks_for(rendered):
    base = rendered["base"]
    for svc in SERVICES:
        find(base, "Deployment", f"meshrl-{svc}")
        find(base, "Service", f"meshrl-{svc}")
        find(base, "ConfigMap", f"meshrl-{svc}-config")
        find(base, "PodDisruptionBudget", f"meshrl-{svc}")
    redis = find(base, "StatefulSet", "meshrl-redis")
    args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes", "Redis must persist with AOF"
    assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    hpa = find(base, "HorizontalPodAutoscaler", "meshrl-rollout")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "meshrl-rollout"}
    assert "replicas" not in find(base, "Deployment", "meshrl-rollout")["spec"], "the HPA owns the replica count"
    for name in ("meshrl-auth", "meshrl-tls", "meshrl-redis-url", "meshrl-redis-auth"):
        find(base, "Secret", name)
    assert find(base, "Secret", "meshrl-tls")["type"] == "kubernetes.io/tls"
    assert all(r["metadata"].get("namespace") == "meshrl" for r in base if r["kind"] != "Namespace")


def test_cpu_overlay_is_small(rendered):
    cpu = rendered["overlays/cpu"]
    hpa = find(cpu, "HorizontalPodAutoscaler", "meshrl-rollout")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 2)
    trainer = pod_spec(find(cpu, "Deployment", "meshrl-trainer"))["containers"][0]
    assert trainer["resources"]["requests"] == {"cpu": "500m", "memory": "2Gi"}
    for deployment in of_kind(cpu, "Deployment"):
        for container in pod_spec(deployment)["containers"]:
            assert "nvidia.com/gpu" not in container["resources"].get("limits", {})


def test_gpu_overlay_gives_trainer_and_rollout_gpus_and_cuda_images(rendered):
    gpu = rendered["overlays/gpu"]
    for svc in GPU_SERVICES:
        spec = pod_spec(find(gpu, "Deployment", f"meshrl-{svc}"))
        container = spec["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert container["image"] == f"meshrl/{svc}:0.1.0-cuda"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        names = [v["name"] for v in spec["volumes"]]
        assert len(names) == len(set(names)), f"{svc}: the patch duplicated a volume: {names}"
        assert next(v for v in spec["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"] == "16Gi"
    for svc in ("scheduler", "databuffer"):
        container = pod_spec(find(gpu, "Deployment", f"meshrl-{svc}"))["containers"][0]
        assert container["image"] == f"meshrl/{svc}:0.1.0"
        assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert find(gpu, "PersistentVolumeClaim", "meshrl-models")["spec"]["accessModes"] == ["ReadWriteMany"]


def test_external_redis_overlay_drops_the_statefulset_and_reads_the_url_secret(rendered):
    ext = rendered["overlays/external-redis"]
    assert not of_kind(ext, "StatefulSet")
    assert not [r for r in ext if r["metadata"]["name"] in ("meshrl-redis", "meshrl-redis-auth")]
    secret = find(ext, "Secret", "meshrl-redis-url")
    assert base64.b64decode(secret["data"]["MESHRL_REDIS__URL"]).decode().startswith("rediss://")
    container = pod_spec(find(ext, "Deployment", "meshrl-databuffer"))["containers"][0]
    assert {"secretRef": {"name": "meshrl-redis-url"}} in container["envFrom"]


# ---- kustomize refuses what is broken ---------------------------------------------------------

needs_kubectl = pytest.mark.skipif(kubectl() is None, reason="kubectl (which carries kustomize) is not installed")

CONFIG_MAP = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata: {}\n"


@needs_kubectl
def test_a_patch_that_matches_nothing_is_an_error(tmp_path):
    (tmp_path / "cm.yaml").write_text(CONFIG_MAP)
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [cm.yaml]\npatches:\n  - patch: |-\n      apiVersion: v1\n      kind: ConfigMap\n"
        "      metadata:\n        name: b\n      data: {x: y}\n"
    )
    with pytest.raises(KustomizeError, match="no resource matches"):
        render(tmp_path)


@needs_kubectl
def test_an_unknown_kustomization_field_is_an_error(tmp_path):
    (tmp_path / "cm.yaml").write_text(CONFIG_MAP)
    (tmp_path / "kustomization.yaml").write_text("resources: [cm.yaml]\nnotAField: 1\n")
    with pytest.raises(KustomizeError, match="notAField"):
        render(tmp_path)


@needs_kubectl
def test_overlays_render_without_secrets_in_git(tmp_path):
    """The repo's own deploy/ has no secrets/ folder (gen-dev-secrets.sh writes it): rendering the base
    from git alone fails and names the missing file, so nobody applies half a deployment."""
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy, ignore=shutil.ignore_patterns("secrets"))
    with pytest.raises(KustomizeError, match="secrets"):
        render(copy / "k8s" / "base")
