#!/usr/bin/env bash
# CI step: install SGLang 0.5.23's CPU-only scheduler path into the CI venv so
# that tests/test_sglang_adapter.py runs instead of skipping.  Call it from
# .ci/run after the venv exists and tenantry is installed in it, e.g.
#
#   PYTHON=.venv/bin/python bash scripts/ci_sglang.sh
#
# Fails loudly (non-zero exit, a FAILED line) if the install or its smoke test
# fails; takes about a minute on a fresh venv (torch is shared with the vLLM
# step), seconds when already installed.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-$(command -v python || command -v python3)}
export PYTHON
start=$(date +%s)
if ! bash "$here/install_sglang.sh"; then
  echo "ci_sglang: FAILED: scripts/install_sglang.sh did not install SGLang into $PYTHON" >&2
  exit 1
fi
if ! "$PYTHON" -c 'from tenantry.engines.sglang import sglang_available as a; ok, why = a(); print("ci_sglang:", why); raise SystemExit(0 if ok else 1)'; then
  echo "ci_sglang: FAILED: SGLang installed but tenantry.engines.sglang cannot use it" >&2
  exit 1
fi
echo "ci_sglang: ok in $(( $(date +%s) - start )) s"
