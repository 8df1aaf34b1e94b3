#!/usr/bin/env bash
# Device check of meshrl's GPU paths, under 8 minutes on one NVIDIA H200; prints its figures and stops at the
# first wrong one (exit 1). `--cpu` runs the CPU twins of the same checks (what CI runs).
#   1. trainer: megatron-core GPTModel train step + log-probs on CUDA (bf16, fp32 master weights) vs transformers
#   2. the transformers engine generating on the device
#   3. colocated publication trainer -> replica in place (CUDA IPC; CPU: shared memory), checksums and GB/s
#   4. the engines' weight-group wire between two ranks (NCCL needs two GPUs: said so when one is present)
# Usage: scripts/gpu_check.sh [--cpu]      (PYTHON=... picks the interpreter; default python3)
#   WHEELS=folder: a python that lacks meshrl's dependencies (a device image with only torch and transformers)
#   gets the wheels in that folder installed into a temporary folder, and imports meshrl from this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
fail() { echo "FAIL $*" >&2; exit 1; }

if [[ -n "${WHEELS:-}" ]]; then
  site="$(mktemp -d)"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$WHEELS"/*.whl \
    || fail "installing the wheels in $WHEELS (one version of each package, built for this python)"
  export PYTHONPATH="$site:$PWD/libs/common:$PWD/services/trainer:$PWD/services/rollout${PYTHONPATH:+:$PYTHONPATH}"
fi

if [[ "${1:-}" == "--cpu" ]]; then
  echo "== CPU twins (no GPU used)"
  "$PY" scripts/gpu_check_engine.py --device cpu --mib 32 || fail "rollout-side check on the CPU"
  exit 0
fi
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' || fail "no CUDA device visible"
echo "== trainer (megatron-core on CUDA)"
"$PY" scripts/gpu_check_trainer.py || fail "trainer check"
echo "== rollout (transformers engine, colocated publication, engine weight group)"
"$PY" scripts/gpu_check_engine.py --device cuda --mib 1024 || fail "rollout-side check"
echo "ALL PASS"
