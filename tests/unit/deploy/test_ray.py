"""The Ray-placed mode's manifests: KubeRay's RayCluster and RayJob (their CRDs are not in the
Kubernetes schemas, so their structure is checked here and their pod templates are validated as
Kubernetes PodTemplates), and the Ray cluster launcher file against Ray's own schema."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import yaml
from _deploy_lib import DEPLOY, find

RAY = DEPLOY / "ray"
K8S_VERSION = kubernetes_validate.latest_version()


def _load(name: str) -> dict:
    docs = [d for d in yaml.safe_load_all((RAY / name).read_text()) if d]
    assert len(docs) == 1
    return docs[0]


def _require(obj: dict, path: str, kind: type) -> object:
    node: object = obj
    for part in path.split("."):
        assert isinstance(node, dict) and part in node, f"missing {path}"
        node = node[part]
    assert isinstance(node, kind), f"{path} should be a {kind.__name__}, is {type(node).__name__}"
    return node


def _validate_pod_template(template: dict, where: str) -> None:
    wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template}
    try:
        kubernetes_validate.validate(wrapped, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{where}: {exc}") from None


def _check_string_map(params: dict, where: str) -> None:
    for key, value in params.items():
        assert isinstance(value, str), f"{where}.{key}: KubeRay wants rayStartParams values as strings"


def test_raycluster_structure_and_pod_templates():
    cluster = _load("raycluster.yaml")
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    _require(cluster, "metadata.name", str)
    import ray

    assert _require(cluster, "spec.rayVersion", str) == ray.__version__, "the image's Ray must be the driver's"
    head = _require(cluster, "spec.headGroupSpec", dict)
    _check_string_map(_require(head, "rayStartParams", dict), "headGroupSpec.rayStartParams")
    _validate_pod_template(_require(head, "template", dict), "headGroupSpec.template")
    assert head["rayStartParams"]["num-gpus"] == "0", "the head runs the driver, not GPU actors"
    groups = _require(cluster, "spec.workerGroupSpecs", list)
    assert groups
    for group in groups:
        name = _require(group, "groupName", str)
        _check_string_map(_require(group, "rayStartParams", dict), f"{name}.rayStartParams")
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        _validate_pod_template(_require(group, "template", dict), f"{name}.template")
        container = group["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1


def test_pod_template_check_catches_a_typo():
    cluster = _load("raycluster.yaml")
    template = copy.deepcopy(cluster["spec"]["headGroupSpec"]["template"])
    template["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(AssertionError):
        _validate_pod_template(template, "head")


def test_rayjob_runs_on_the_raycluster():
    cluster = _load("raycluster.yaml")
    job = _load("rayjob.yaml")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert job["metadata"]["namespace"] == cluster["metadata"]["namespace"]
    assert _require(job, "spec.clusterSelector", dict) == {"ray.io/cluster": cluster["metadata"]["name"]}
    entrypoint = _require(job, "spec.entrypoint", str)
    assert entrypoint.split()[:2] == ["meshrl", "run"] and "services.ray_address=auto" in entrypoint
    workflow = entrypoint.split()[2]
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in head["containers"][0]["volumeMounts"]}
    mount = next(path for path in mounts if workflow.startswith(path + "/"))
    volume = next(v for v in head["volumes"] if v["name"] == mounts[mount])
    assert volume["configMap"]["name"] == "meshrl-job"
    _validate_pod_template(_require(job, "spec.submitterPodTemplate", dict), "submitterPodTemplate")


def test_ray_pods_use_the_secrets_and_claims_the_k8s_base_makes(rendered):
    base = rendered["base"]
    cluster = _load("raycluster.yaml")
    assert cluster["metadata"]["namespace"] == find(base, "Namespace", "meshrl")["metadata"]["name"]
    templates = [cluster["spec"]["headGroupSpec"]["template"]]
    templates += [g["template"] for g in cluster["spec"]["workerGroupSpecs"]]
    for template in templates:
        spec = template["spec"]
        assert spec["enableServiceLinks"] is False
        for volume in spec["volumes"]:
            for source in volume.get("projected", {}).get("sources", []):
                find(base, "Secret", source["secret"]["name"])
            if "persistentVolumeClaim" in volume:
                find(base, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])


def test_cluster_launcher_file_passes_rays_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((RAY / "cluster.yaml").read_text())
    validate_config(prepare_config(copy.deepcopy(config)))
    assert config["provider"]["type"] == "local"
    assert config["max_workers"] == len(config["provider"]["worker_ips"])
    broken = copy.deepcopy(config)
    broken["head_start_ray_command"] = broken.pop("head_start_ray_commands")  # a typo
    with pytest.raises(Exception, match="head_start_ray_command"):
        validate_config(prepare_config(broken))
