"""Renders a kustomization offline, without kubectl: the subset of kustomize that deploy/k8s uses.

Used by tests/unit/deploy (which render every overlay and validate the result) and by anyone
without kubectl: `python deploy/tools/kustomize_lite.py deploy/k8s/overlays/cpu > meshrl.yaml`.
Supported: resources (files and kustomization folders), configMapGenerator / secretGenerator
(files, literals, envs; behavior create / replace / merge) with disableNameSuffixHash, patches
(strategic merge, or JSON 6902 with a target), images, namespace, labels (metadata only).
Any other field is refused with an error, never silently ignored; where kubectl exists the tests
check that this renderer and `kubectl kustomize` agree.
"""

from __future__ import annotations

import argparse
import base64
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

Resource = dict[str, Any]
SUPPORTED_FIELDS = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "labels",
    "images",
    "patches",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "IngressClass",
    "RuntimeClass",
}
# Strategic-merge keys of the lists deploy/k8s patches; a list without one is replaced whole.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "volumeClaimTemplates": "metadata.name",
}
PORT_KEYS = ("containerPort", "port")


class KustomizeError(Exception):
    """A kustomization this renderer cannot build: the message names the file and what to change."""


def read_documents(path: Path) -> list[Resource]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc or "metadata" not in doc:
            raise KustomizeError(f"{path}: every document needs kind and metadata")
    return docs


def resource_id(res: Resource) -> tuple[str, str, str]:
    meta = res.get("metadata", {})
    return res["kind"], meta.get("namespace", ""), meta["name"]


def _kustomization_file(folder: Path) -> Path:
    for name in ("kustomization.yaml", "kustomization.yml", "Kustomization"):
        if (folder / name).is_file():
            return folder / name
    raise KustomizeError(f"{folder}: no kustomization.yaml in this folder")


def _inside(root: Path, path: Path, what: str) -> Path:
    resolved = (root / path).resolve()
    if root.resolve() not in resolved.parents and resolved != root.resolve():
        raise KustomizeError(f"{root}: {what} {path} lies outside the kustomization folder (kustomize refuses it)")
    return resolved


# ---- generators -------------------------------------------------------------------------------


def _generator_data(root: Path, spec: dict[str, Any]) -> dict[str, str]:
    data: dict[str, str] = {}
    for item in spec.get("files", []):
        key, sep, rel = item.partition("=")
        rel = rel if sep else key
        key = key if sep else Path(rel).name
        path = _inside(root, Path(rel), "file")
        if not path.is_file():
            raise KustomizeError(f"{root}: generator {spec['name']} reads {rel}, which does not exist")
        data[key] = path.read_text()
    for item in spec.get("literals", []):
        key, _, value = item.partition("=")
        data[key] = value
    for rel in spec.get("envs", []):
        path = _inside(root, Path(rel), "env file")
        if not path.is_file():
            raise KustomizeError(f"{root}: generator {spec['name']} reads {rel}, which does not exist")
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise KustomizeError(f"{path}: line {line!r} is not KEY=VALUE")
            data[key] = value
    unknown = set(spec) - {"name", "files", "literals", "envs", "behavior", "type"}
    if unknown:
        raise KustomizeError(f"{root}: generator {spec['name']} uses {sorted(unknown)}, which kustomize_lite lacks")
    return data


def _generate(root: Path, spec: dict[str, Any], kind: str) -> Resource:
    data = _generator_data(root, spec)
    res: Resource = {"apiVersion": "v1", "kind": kind, "metadata": {"name": spec["name"]}}
    if kind == "Secret":
        res["type"] = spec.get("type", "Opaque")
        res["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    else:
        res["data"] = data
    return res


def _apply_generator(resources: list[Resource], new: Resource, behavior: str, root: Path) -> None:
    matches = [r for r in resources if r["kind"] == new["kind"] and r["metadata"]["name"] == new["metadata"]["name"]]
    if behavior == "create":
        if matches:
            raise KustomizeError(f"{root}: {new['kind']} {new['metadata']['name']} exists; use behavior: replace/merge")
        resources.append(new)
        return
    if not matches:
        raise KustomizeError(f"{root}: behavior {behavior} needs an existing {new['kind']} {new['metadata']['name']}")
    old = matches[0]
    if behavior == "replace":
        old["data"] = new["data"]
    elif behavior == "merge":
        old["data"] = {**old.get("data", {}), **new["data"]}
    else:
        raise KustomizeError(f"{root}: unknown generator behavior {behavior!r} (create, replace, merge)")
    if "type" in new and behavior == "replace":
        old["type"] = new["type"]


# ---- patches ----------------------------------------------------------------------------------


def _merge_key(name: str, items: list[Any]) -> str | None:
    if name in MERGE_KEYS:
        return MERGE_KEYS[name]
    if name == "ports" and items and isinstance(items[0], dict):
        return next((k for k in PORT_KEYS if k in items[0]), None)
    return None


def _key_of(item: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        item = item.get(part, {}) if isinstance(item, dict) else {}
    return item


def strategic_merge(target: Any, patch: Any, field: str = "") -> Any:
    """Applies a strategic-merge patch: maps merge, keyed lists merge by key, null deletes a field."""
    if isinstance(patch, dict) and isinstance(target, dict):
        if patch.get("$patch") == "replace":
            return {k: v for k, v in patch.items() if k != "$patch"}
        out = dict(target)
        for key, value in patch.items():
            if key == "$patch":
                continue
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = strategic_merge(out[key], value, key)
            else:
                out[key] = strategic_merge({}, value, key) if isinstance(value, dict) else copy.deepcopy(value)
        return out
    if isinstance(patch, dict):
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch" and v is not None}
    if isinstance(patch, list) and isinstance(target, list):
        key = _merge_key(field, target or patch)
        if key is None:
            return copy.deepcopy(patch)
        out = list(target)
        for item in patch:
            idx = next((i for i, t in enumerate(out) if _key_of(t, key) == _key_of(item, key)), None)
            if isinstance(item, dict) and item.get("$patch") == "delete":
                if idx is not None:
                    out.pop(idx)
            elif idx is None:
                out.append(copy.deepcopy(item))
            else:
                out[idx] = strategic_merge(out[idx], item, field)
        return out
    return copy.deepcopy(patch)


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise KustomizeError(f"JSON patch path {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json6902(doc: Resource, ops: list[dict[str, Any]]) -> Resource:
    """Applies RFC 6902 operations add, remove, replace and test."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = _pointer(op["path"])
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        kind = op["op"]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            elif kind == "remove":
                parent.pop(index)
            elif kind == "replace":
                parent[index] = copy.deepcopy(op["value"])
            elif kind == "test":
                if parent[index] != op["value"]:
                    raise KustomizeError(f"JSON patch test failed at {op['path']}")
            else:
                raise KustomizeError(f"JSON patch op {kind!r} is not supported by kustomize_lite")
            continue
        if kind == "add":
            parent[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del parent[last]
        elif kind == "replace":
            if last not in parent:
                raise KustomizeError(f"JSON patch replace: {op['path']} does not exist")
            parent[last] = copy.deepcopy(op["value"])
        elif kind == "test":
            if parent.get(last) != op["value"]:
                raise KustomizeError(f"JSON patch test failed at {op['path']}")
        else:
            raise KustomizeError(f"JSON patch op {kind!r} is not supported by kustomize_lite")
    return doc


def _selected(res: Resource, target: dict[str, Any]) -> bool:
    unknown = set(target) - {"kind", "name", "namespace", "group", "version"}
    if unknown:
        raise KustomizeError(f"patch target selectors {sorted(unknown)} are not supported by kustomize_lite")
    meta = res["metadata"]
    group, _, version = res["apiVersion"].rpartition("/")
    return (
        target.get("kind", res["kind"]) == res["kind"]
        and target.get("name", meta["name"]) == meta["name"]
        and target.get("namespace", meta.get("namespace", "")) == meta.get("namespace", "")
        and target.get("group", group) == group
        and target.get("version", version) == version
    )


def _patched(res: Resource, body: dict[str, Any], meta_patch: dict[str, Any]) -> Resource:
    merged = strategic_merge(res, body)
    merged["metadata"] = strategic_merge(res["metadata"], meta_patch)
    return merged


def _apply_patch(resources: list[Resource], root: Path, entry: dict[str, Any]) -> list[Resource]:
    if "path" in entry:
        text = _inside(root, Path(entry["path"]), "patch").read_text()
    elif "patch" in entry:
        text = entry["patch"]
    else:
        raise KustomizeError(f"{root}: a patch needs path or patch")
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    target = entry.get("target")
    if docs and isinstance(docs[0], list):
        if target is None:
            raise KustomizeError(f"{root}: a JSON 6902 patch needs a target")
        chosen = [r for r in resources if _selected(r, target)]
        if not chosen:
            raise KustomizeError(f"{root}: patch target {target} matches no resource")
        picked = {id(r) for r in chosen}
        return [json6902(r, docs[0]) if id(r) in picked else r for r in resources]
    for patch in docs:
        sel = target or {"kind": patch["kind"], "name": patch["metadata"]["name"]}
        chosen = [r for r in resources if _selected(r, sel)]
        if not chosen:
            raise KustomizeError(f"{root}: patch for {sel} matches no resource")
        picked = {id(r) for r in chosen}
        if patch.get("$patch") == "delete":
            resources = [r for r in resources if id(r) not in picked]
            continue
        body = {k: v for k, v in patch.items() if k not in ("apiVersion", "kind", "metadata")}
        meta_patch = {k: v for k, v in patch.get("metadata", {}).items() if k not in ("name", "namespace")}
        resources = [_patched(r, body, meta_patch) if id(r) in picked else r for r in resources]
    return resources


# ---- transformers -----------------------------------------------------------------------------


def _pod_specs(res: Resource) -> list[dict[str, Any]]:
    spec = res.get("spec", {})
    if res["kind"] == "Pod":
        return [spec]
    if res["kind"] == "CronJob":
        return [spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec", {})]
    template = spec.get("template", {})
    return [template.get("spec", {})] if "template" in spec else []


def _set_image(image: str, rules: list[dict[str, Any]]) -> str:
    name, tag = image, ""
    if "@" in image:
        name, _, digest = image.partition("@")
        tag = "@" + digest
    elif ":" in image.rsplit("/", 1)[-1]:
        name, _, t = image.rpartition(":")
        tag = ":" + t
    for rule in rules:
        if rule["name"] != name:
            continue
        name = rule.get("newName", name)
        if "digest" in rule:
            tag = "@" + rule["digest"]
        elif "newTag" in rule:
            tag = ":" + str(rule["newTag"])
        break
    return name + tag


def _apply_images(resources: list[Resource], rules: list[dict[str, Any]]) -> None:
    for res in resources:
        for pod in _pod_specs(res):
            for group in ("initContainers", "containers"):
                for container in pod.get(group, []):
                    container["image"] = _set_image(container["image"], rules)


def _apply_labels(resources: list[Resource], entries: list[dict[str, Any]], root: Path) -> None:
    for entry in entries:
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise KustomizeError(f"{root}: labels with includeSelectors/includeTemplates are not supported")
        for res in resources:
            res["metadata"].setdefault("labels", {}).update(entry.get("pairs", {}))


# ---- build ------------------------------------------------------------------------------------


def build(folder: str | Path) -> list[Resource]:
    """Renders the kustomization in `folder` into a list of Kubernetes objects."""
    root = Path(folder)
    kfile = _kustomization_file(root)
    k = yaml.safe_load(kfile.read_text()) or {}
    unknown = set(k) - SUPPORTED_FIELDS
    if unknown:
        raise KustomizeError(f"{kfile}: fields {sorted(unknown)} are not supported by kustomize_lite")
    resources: list[Resource] = []
    for rel in k.get("resources", []):
        path = (root / rel).resolve()
        resources.extend(build(path) if path.is_dir() else read_documents(path))
    options = k.get("generatorOptions", {})
    if (k.get("configMapGenerator") or k.get("secretGenerator")) and not options.get("disableNameSuffixHash"):
        raise KustomizeError(f"{kfile}: set generatorOptions.disableNameSuffixHash: true (name hashes unsupported)")
    for key, kind in (("configMapGenerator", "ConfigMap"), ("secretGenerator", "Secret")):
        for spec in k.get(key, []):
            _apply_generator(resources, _generate(root, spec, kind), spec.get("behavior", "create"), root)
    for entry in k.get("patches", []):
        resources = _apply_patch(resources, root, entry)
    if "namespace" in k:
        for res in resources:
            if res["kind"] not in CLUSTER_SCOPED:
                res["metadata"]["namespace"] = k["namespace"]
    _apply_labels(resources, k.get("labels", []), root)
    _apply_images(resources, k.get("images", []))
    seen: set[tuple[str, str, str]] = set()
    for res in resources:
        rid = resource_id(res)
        if rid in seen:
            raise KustomizeError(f"{kfile}: {rid} is defined twice")
        seen.add(rid)
    return resources


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a folder holding kustomization.yaml, e.g. deploy/k8s/overlays/cpu")
    args = parser.parse_args(argv)
    try:
        docs = build(args.folder)
    except KustomizeError as exc:
        print(f"kustomize_lite: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
