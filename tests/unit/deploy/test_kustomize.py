"""Every Kubernetes overlay of deploy/k8s renders offline and validates against the Kubernetes JSON
schemas (kubernetes-validate, strict: unknown fields are errors); each overlay does what it says;
the offline renderer (deploy/tools/kustomize_lite.py) follows kustomize, and agrees with
`kubectl kustomize` where kubectl exists."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from _deploy_lib import GPU_SERVICES, OVERLAYS, SERVICES, find, of_kind, pod_spec
from kustomize_lite import KustomizeError, build, json6902, strategic_merge

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


# ---- the renderer itself ----------------------------------------------------------------------


def test_strategic_merge_merges_keyed_lists_and_deletes():
    target = {
        "containers": [{"name": "a", "image": "x", "env": [{"name": "K", "value": "1"}]}, {"name": "b"}],
        "volumes": [{"name": "v", "emptyDir": {}}],
        "tolerations": [{"key": "old"}],
        "keep": 1,
    }
    patch = {
        "containers": [{"name": "a", "env": [{"name": "J", "value": "2"}]}, {"name": "b", "$patch": "delete"}],
        "volumes": [{"name": "w", "emptyDir": {}}],
        "tolerations": [{"key": "new"}],
        "keep": None,
    }
    out = strategic_merge(target, patch)
    assert out["containers"] == [
        {"name": "a", "image": "x", "env": [{"name": "K", "value": "1"}, {"name": "J", "value": "2"}]}
    ]
    assert [v["name"] for v in out["volumes"]] == ["v", "w"]
    assert out["tolerations"] == [{"key": "new"}], "lists without a merge key are replaced"
    assert "keep" not in out


def test_json6902_operations():
    doc = {"spec": {"accessModes": ["ReadWriteOnce"], "n": 1}}
    out = json6902(
        doc,
        [
            {"op": "replace", "path": "/spec/n", "value": 2},
            {"op": "add", "path": "/spec/accessModes/-", "value": "ReadOnlyMany"},
            {"op": "test", "path": "/spec/n", "value": 2},
        ],
    )
    assert out == {"spec": {"accessModes": ["ReadWriteOnce", "ReadOnlyMany"], "n": 2}}
    assert doc["spec"]["n"] == 1, "the input is not modified"
    with pytest.raises(KustomizeError):
        json6902(doc, [{"op": "replace", "path": "/spec/missing", "value": 0}])


def test_unsupported_kustomize_fields_are_refused(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefix: dev-\n")
    with pytest.raises(KustomizeError, match="namePrefix"):
        build(tmp_path)


def test_a_patch_that_matches_nothing_is_an_error(tmp_path):
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata: {}\n")
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [cm.yaml]\npatches:\n  - patch: |-\n      apiVersion: v1\n      kind: ConfigMap\n"
        "      metadata:\n        name: b\n      data: {x: y}\n"
    )
    with pytest.raises(KustomizeError, match="matches no resource"):
        build(tmp_path)


def _normalized(text: str) -> dict[tuple[str, str], dict]:
    """Objects by (kind, name), with lists of named items sorted and Secret data unwrapped."""

    def norm(x):
        if isinstance(x, dict):
            return {k: norm(v) for k, v in x.items()}
        if isinstance(x, list):
            items = [norm(v) for v in x]
            if items and all(isinstance(i, dict) and "name" in i for i in items):
                items.sort(key=lambda i: str(i["name"]))
            return items
        return x

    out = {}
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        if doc["kind"] == "Secret":
            doc["data"] = {k: "".join(v.split()) for k, v in doc.get("data", {}).items()}
        out[(doc["kind"], doc["metadata"]["name"])] = norm(doc)
    return out


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_renderer_agrees_with_kubectl_kustomize(deploy_copy, overlay):
    folder = Path(deploy_copy) / "k8s" / overlay
    real = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert real.returncode == 0, real.stderr
    ours = yaml.safe_dump_all(build(folder))
    assert _normalized(ours) == _normalized(real.stdout)
