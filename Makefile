# The two commands a new machine needs: `make run` (the main job on the embedded defaults)
# and `make test` (the whole suite, lint included). Both create .venv and install every
# distribution of the monorepo into it when it is missing or out of date.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.meshrl-installed
DISTS := libs/common services/databuffer services/trainer services/rollout services/scheduler
PYPROJECTS := $(addsuffix /pyproject.toml,$(DISTS))
RUN_ARGS ?=

.PHONY: setup setup-trl run test lint protos clean

$(STAMP): $(PYPROJECTS) requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: this version installs a CPU build; a looser pin pulls CUDA wheels.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet --config-settings editable_mode=compat \
		$(addprefix -e ,$(DISTS)) -r requirements-dev.txt
	touch $(STAMP)

setup: $(STAMP)

# TRL for bench/vs_trl only (optional; torch stays at the pinned CPU build through constraints.txt).
setup-trl: setup
	$(PY) -m pip install --quiet -r requirements-trl.txt

run: setup
	$(VENV)/bin/meshrl run examples/countdown/workflow.yaml $(RUN_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: setup lint
	$(VENV)/bin/pytest

protos: setup
	$(PY) scripts/gen_protos.py

clean:
	rm -rf $(VENV) .pytest_cache
