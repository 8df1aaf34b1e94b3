"""Names, ports and probes agree everywhere: deploy/ports.yaml is the one table, and the Kubernetes
Deployments, Services, probes, PodDisruptionBudgets, config files, the compose file and the
services' own config defaults all follow it; every name a manifest refers to exists."""

from __future__ import annotations

import base64
import importlib
import re

import pydantic
import pytest
import yaml
from _deploy_lib import COMPOSE_ONLY_SECRETS, DEPLOY, OVERLAYS, SECRET_FILES, SERVICES, find, of_kind, pod_spec

CONFIG_DIR = DEPLOY / "k8s" / "base" / "config"
COMPOSE = DEPLOY / "compose" / "docker-compose.yaml"


def workloads(resources):
    return [r for r in resources if r["kind"] in ("Deployment", "StatefulSet")]


@pytest.mark.parametrize("svc", SERVICES)
def test_deployment_ports_and_probes_follow_the_port_table(rendered, ports, svc):
    want = ports["services"][svc]
    for overlay in OVERLAYS:
        deployment = find(rendered[overlay], "Deployment", want["name"])
        container = pod_spec(deployment)["containers"][0]
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert (
            named["grpc"] == want["grpc"] and named["health"] == want["health"] and named["metrics"] == want["metrics"]
        )
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"] == {"port": want["health"]}, f"{overlay} {svc} {probe}"
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(want["metrics"])
        assert container["args"] == ["--config", "/etc/meshrl/config.yaml"]


@pytest.mark.parametrize("svc", SERVICES)
def test_service_ports_and_selectors_reach_the_pods(rendered, ports, svc):
    want = ports["services"][svc]
    base = rendered["base"]
    pod_labels = find(base, "Deployment", want["name"])["spec"]["template"]["metadata"]["labels"]
    services = [
        s for s in of_kind(base, "Service") if s["metadata"]["name"] in (want["name"], want["name"] + "-headless")
    ]
    assert services
    for service in services:
        assert service["spec"]["selector"].items() <= pod_labels.items()
        by_name = {p["name"]: p for p in service["spec"]["ports"]}
        assert by_name["grpc"]["port"] == want["grpc"] and by_name["grpc"]["targetPort"] == "grpc"
        assert by_name["metrics"]["port"] == want["metrics"]
        assert "health" not in by_name, "the plaintext health port is for probes only, not for clients"


def test_redis_service_matches_the_port_table(rendered, ports):
    service = find(rendered["base"], "Service", ports["redis"]["name"])
    assert service["spec"]["ports"][0]["port"] == ports["redis"]["port"]
    url = yaml.safe_load(SECRET_FILES["redis.env"].replace("=", ": ", 1))["MESHRL_REDIS__URL"]
    assert f"@{ports['redis']['name']}:{ports['redis']['port']}/" in url


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_selector_and_reference_resolves(rendered, overlay):
    resources = rendered[overlay]
    names = {(r["kind"], r["metadata"]["name"]) for r in resources}
    pods = [w["spec"]["template"]["metadata"]["labels"] for w in workloads(resources)]
    for pdb in of_kind(resources, "PodDisruptionBudget"):
        wanted = pdb["spec"]["selector"]["matchLabels"]
        assert sum(wanted.items() <= labels.items() for labels in pods) == 1, pdb["metadata"]["name"]
    for hpa in of_kind(resources, "HorizontalPodAutoscaler"):
        assert (hpa["spec"]["scaleTargetRef"]["kind"], hpa["spec"]["scaleTargetRef"]["name"]) in names
    for workload in workloads(resources):
        spec = pod_spec(workload)
        claims = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in names
            if "secret" in volume:
                assert ("Secret", volume["secret"]["secretName"]) in names
            if "persistentVolumeClaim" in volume:
                assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in names
            for source in volume.get("projected", {}).get("sources", []):
                assert ("Secret", source["secret"]["name"]) in names
        mounts = {m["name"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
        assert mounts <= {v["name"] for v in spec.get("volumes", [])} | claims, workload["metadata"]["name"]
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                assert ("Secret", source["secretRef"]["name"]) in names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_are_locked_down_and_get_no_service_link_variables(rendered, overlay):
    for workload in workloads(rendered[overlay]):
        spec = pod_spec(workload)
        # Kubernetes would inject MESHRL_<SERVICE>_PORT=tcp://... for each Service, which the services'
        # MESHRL_* config loader would read as unknown config fields.
        assert spec.get("enableServiceLinks") is False, workload["metadata"]["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["automountServiceAccountToken"] is False
        for container in spec["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("svc", SERVICES)
def test_config_files_follow_the_port_table(ports, svc):
    want = ports["services"][svc]
    config = yaml.safe_load((CONFIG_DIR / f"{svc}.yaml").read_text())
    assert config["server"]["port"] == want["grpc"]
    assert config["server"]["health_port"] == want["health"]
    assert config["server"]["host"] == "0.0.0.0"
    assert config["telemetry"]["prometheus_port"] == want["metrics"]
    mounted = "/var/run/secrets/meshrl/"
    assert config["server"]["auth"]["token_file"] == mounted + "auth/token"
    assert config["server"]["require_auth"] is True
    assert config["server"]["tls"] == {
        "cert_file": mounted + "tls/tls.crt",
        "key_file": mounted + "tls/tls.key",
        "ca_file": mounted + "tls/ca.crt",
    }


def _service_config_model(svc: str) -> type[pydantic.BaseModel]:
    """The pydantic model `python -m meshrl.<svc>` loads: the one meshrl.<svc>.config (a module or a package)
    defines or exports with a `server` field."""
    module = importlib.import_module(f"meshrl.{svc}.config")
    models = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, pydantic.BaseModel)
        and (obj.__module__ == module.__name__ or obj.__module__.startswith(module.__name__ + "."))
        and "server" in obj.model_fields
    ]
    assert len(models) == 1, f"meshrl.{svc}.config should define one service config with a `server` field: {models}"
    return models[0]


def pod_environment(resources: list[dict], deployment: dict) -> dict[str, str]:
    """The environment Kubernetes gives the deployment's first container (fieldRefs get sample values)."""
    secrets = {
        s["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in s["data"].items()}
        for s in of_kind(resources, "Secret")
    }
    fields = {"status.podIP": "10.1.2.3", "metadata.name": deployment["metadata"]["name"] + "-5d9c7-x2x4q"}
    container = pod_spec(deployment)["containers"][0]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(secrets[source["secretRef"]["name"]])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), var["value"])
        elif "fieldRef" in var["valueFrom"]:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets[ref["name"]][ref["key"]]
    return env


def test_rollout_advertises_its_pod_ip_and_grpc_port(rendered, ports):
    env = pod_environment(rendered["base"], find(rendered["base"], "Deployment", "meshrl-rollout"))
    assert env["MESHRL_ADVERTISE_ADDRESS"] == f"10.1.2.3:{ports['services']['rollout']['grpc']}"
    assert env["MESHRL_REGISTRY__REDIS_URL"].startswith("redis://")


@pytest.mark.parametrize("svc", SERVICES)
def test_services_accept_the_deployed_config_and_default_to_the_table(rendered, ports, svc, tmp_path):
    """What `python -m meshrl.<svc> --config /etc/meshrl/config.yaml` loads inside the pod, in every overlay."""
    from meshrl.common.config import load_config

    model = _service_config_model(svc)
    default_server = model.model_fields["server"].get_default(call_default_factory=True)
    assert default_server.port == ports["services"][svc]["grpc"], f"meshrl.{svc}'s default port"
    for overlay in OVERLAYS:
        resources = rendered[overlay]
        deployment = find(resources, "Deployment", ports["services"][svc]["name"])
        volume = next(v for v in pod_spec(deployment)["volumes"] if "configMap" in v)  # kustomize may reorder
        config_map = find(resources, "ConfigMap", volume["configMap"]["name"])
        path = tmp_path / overlay.replace("/", "-") / "config.yaml"
        path.parent.mkdir()
        path.write_text(config_map["data"]["config.yaml"])
        config = load_config(model, path=path, env=pod_environment(resources, deployment))
        assert config.server.port == ports["services"][svc]["grpc"], overlay
        assert config.server.require_auth and config.server.tls is not None, overlay


# ---- compose ----------------------------------------------------------------------------------


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_names_and_builds_follow_the_port_table(ports):
    compose = _compose()
    services = compose["services"]
    assert set(services) == {ports["services"][s]["name"] for s in SERVICES} | {ports["redis"]["name"]}
    for svc in SERVICES:
        entry = services[ports["services"][svc]["name"]]
        assert (COMPOSE.parent / entry["build"]["context"]).resolve() == DEPLOY.parent
        assert entry["build"]["dockerfile"] == f"services/{svc}/Dockerfile"
        assert entry["command"] == ["--config", "/etc/meshrl/config.yaml"]
        source, target, mode = entry["volumes"][0].split(":")
        assert (COMPOSE.parent / source).resolve() == CONFIG_DIR / f"{svc}.yaml"
        assert (target, mode) == ("/etc/meshrl/config.yaml", "ro")
        targets = {s["target"] for s in entry["secrets"]}
        assert targets == {
            "/var/run/secrets/meshrl/auth/token",
            "/var/run/secrets/meshrl/tls/tls.crt",
            "/var/run/secrets/meshrl/tls/tls.key",
            "/var/run/secrets/meshrl/tls/ca.crt",
        }
        for dep in entry.get("depends_on", {}):
            assert dep in services
        assert "environment" not in entry, "config belongs in the config file; secrets in env_file / secrets"
    assert services["meshrl-scheduler"]["ports"] == [f"127.0.0.1:{ports['services']['scheduler']['grpc']}:50050"]
    assert "meshrl-rollout-headless" in services["meshrl-rollout"]["networks"]["default"]["aliases"]
    assert "healthcheck" in services["meshrl-redis"]


def test_compose_secrets_are_the_files_gen_dev_secrets_writes():
    compose = _compose()
    script = (DEPLOY / "gen-dev-secrets.sh").read_text()
    files = [(COMPOSE.parent / s["file"]).resolve() for s in compose["secrets"].values()]
    files += [(COMPOSE.parent / f).resolve() for s in compose["services"].values() for f in s.get("env_file", [])]
    for path in files:
        assert path.parent == DEPLOY / "k8s" / "base" / "secrets"
        assert path.name in SECRET_FILES
        assert re.search(rf'"\$out/{re.escape(path.name)}"', script), f"gen-dev-secrets.sh does not write {path.name}"
    kustomization = (DEPLOY / "k8s" / "base" / "kustomization.yaml").read_text()
    for name in set(SECRET_FILES) - COMPOSE_ONLY_SECRETS:
        assert f"secrets/{name}" in kustomization


# --- every pod's client channels agree with the peers they reach (rendered by `kubectl kustomize`) ---


def _kubectl_kustomize(folder) -> list[dict]:
    import shutil
    import subprocess

    if shutil.which("kubectl") is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    out = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _service_config(resources: list[dict], svc: str) -> dict:
    workload = next(w for w in workloads(resources) if w["metadata"]["name"] == f"meshrl-{svc}")
    volume = next(v for v in pod_spec(workload)["volumes"] if v["name"] == "config")
    config_map = find(resources, "ConfigMap", volume["configMap"]["name"])
    return yaml.safe_load(config_map["data"]["config.yaml"])


def _mounted_files(resources: list[dict], svc: str) -> set[str]:
    """Every file path the pod of `svc` sees from its projected secrets, and the roots of its other volumes."""
    workload = next(w for w in workloads(resources) if w["metadata"]["name"] == f"meshrl-{svc}")
    spec = pod_spec(workload)
    volumes = {v["name"]: v for v in spec["volumes"]}
    seen = set()
    for container in spec["containers"]:
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            sources = volume.get("projected", {}).get("sources", [])
            seen |= {f"{mount['mountPath']}/{i['path']}" for s in sources for i in s.get("secret", {}).get("items", [])}
            if "persistentVolumeClaim" in volume:
                seen.add(f"{mount['mountPath']}/")
    return seen


def _tls_files(section: dict | None) -> list[str]:
    return [v for k, v in (section or {}).items() if k.endswith("_file") and v]


@pytest.mark.parametrize("overlay", ["overlays/cpu", "overlays/gpu"])
def test_every_pods_client_channels_agree_with_their_peers(deploy_copy, ports, overlay):
    resources = _kubectl_kustomize(deploy_copy / "k8s" / overlay)
    configs = {svc: _service_config(resources, svc) for svc in SERVICES}
    peer = configs["databuffer"]["server"]
    table = ports["services"]["databuffer"]
    for svc in ("trainer", "rollout"):
        channel = configs[svc].get("databuffer")
        assert channel, f"{svc}'s config names no data buffer channel (databuffer: address, tls, auth)"
        assert channel["address"] == f"{table['name']}:{table['grpc']}", (svc, channel)
        service = find(resources, "Service", table["name"])
        assert table["grpc"] in [p["port"] for p in service["spec"]["ports"]]
        if peer.get("tls"):
            assert channel.get("tls", {}).get("ca_file"), f"{svc} dials a TLS data buffer without tls.ca_file"
        if peer.get("tls", {}).get("ca_file"):  # the data buffer asks for client certificates
            assert channel["tls"].get("cert_file") and channel["tls"].get("key_file"), f"{svc}: mTLS needs a cert"
        if peer.get("require_auth"):
            assert channel.get("auth", {}).get("token_file"), f"{svc} sends no token to a data buffer that needs one"
        mounted = _mounted_files(resources, svc)
        for path in [*_tls_files(channel.get("tls")), channel.get("auth", {}).get("token_file")]:
            assert path in mounted, f"{svc}'s channel file {path} is not mounted in its pod ({sorted(mounted)})"
    for svc in SERVICES:
        server = configs[svc]["server"]
        mounted = _mounted_files(resources, svc)
        for path in [*_tls_files(server.get("tls")), server.get("auth", {}).get("token_file")]:
            assert path in mounted, f"{svc}'s server file {path} is not mounted in its pod"
    model = configs["rollout"]["engine"]["model_path"]
    for svc in ("rollout", "trainer", "scheduler"):  # each reads the model (weights, tokenizer)
        roots = [p for p in _mounted_files(resources, svc) if p.endswith("/") and model.startswith(p)]
        assert roots, f"{svc}'s pod does not mount the models volume that holds {model}"
