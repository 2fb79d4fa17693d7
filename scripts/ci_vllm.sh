#!/usr/bin/env bash
# CI step: install vLLM's CPU-only scheduler path into the CI venv so that
# tests/test_vllm_adapter.py runs instead of skipping.  Call it from .ci/run
# after the venv exists and tenantry is installed in it, e.g.
#
#   PYTHON=.venv/bin/python bash scripts/ci_vllm.sh
#
# Fails loudly (non-zero exit, a FAILED line) if the install or its smoke test
# fails; takes about a minute on a fresh venv, seconds when already installed.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-$(command -v python || command -v python3)}
export PYTHON
start=$(date +%s)
if ! bash "$here/install_vllm.sh"; then
  echo "ci_vllm: FAILED: scripts/install_vllm.sh did not install vLLM into $PYTHON" >&2
  exit 1
fi
if ! "$PYTHON" -c 'from tenantry.engines.vllm import vllm_available as a; ok, why = a(); print("ci_vllm:", why); raise SystemExit(0 if ok else 1)'; then
  echo "ci_vllm: FAILED: vLLM installed but tenantry.engines.vllm cannot use it" >&2
  exit 1
fi
echo "ci_vllm: ok in $(( $(date +%s) - start )) s"
