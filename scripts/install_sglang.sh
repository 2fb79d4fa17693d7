#!/usr/bin/env bash
# Install SGLang 0.5.23's scheduler, CPU-only, into the current Python
# environment (whatever `$PYTHON -m pip` installs into; PYTHON defaults to
# `python`, else `python3`), for tenantry.engines.sglang.
#
#   bash scripts/install_sglang.sh                 # the active venv's python
#   PYTHON=/path/to/venv/bin/python bash scripts/install_sglang.sh
#
# SGLang's own requirements pull CUDA torch 2.14.1, flashinfer, deep-gemm,
# cutlass and many GB more; the scheduler path needs none of it.  So: torch
# 2.13.0 (the CPU build; SGLang pins 2.14.1 but its scheduler runs on 2.13),
# sglang with --no-deps, and exactly the packages that importing
# `sglang.srt.managers.scheduler`, `sglang.srt.server_args` and the memory
# pools needs, found by iterating on ImportError in a fresh venv, each pinned
# and installed with --no-deps (SGLang's own pins where it has them:
# transformers 5.19.0, tokenizers 0.23.2, openai 2.8.0, compressed-tensors
# 0.18.0, sentencepiece 0.2.1, apache-tvm-ffi 0.1.11; fastapi 0.136.3).
# triton is a hard import (about 1 GB; it imports without a GPU and no Triton
# kernel runs: the paged allocator's CPU path is used).  torchvision is not
# installed: no wheel imports beside this torch, and tenantry.engines.sglang
# puts an import stub in its place (two multimodal config modules import it).
#
# Idempotent: only what is missing or at another version is installed; a run
# with nothing to do makes no pip call.  Ends with a smoke test that builds
# SGLang's scheduler for a tiny Llama config.json written into a temporary
# folder and runs one request through it (no network, nothing from a hub).
# Exits non-zero if anything fails.
set -euo pipefail

PYTHON=${PYTHON:-$(command -v python || command -v python3)}
say() { printf '[install_sglang] %s\n' "$*"; }
say "python: $PYTHON ($("$PYTHON" -c 'import sys; print(sys.version.split()[0], sys.prefix)'))"

# torch: the +cpu wheel.  On this workplace's machines pip finds it on local
# disk (find-links in pip's config); elsewhere set TORCH_SPEC, e.g. to a local
# wheel path, or add --index-url for the PyTorch CPU index via PIP_EXTRA.
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

# name==version, installed with --no-deps.  Grouped by who needs them.
PINNED=(
  "$TORCH_SPEC"
  sglang==0.5.23
  triton==3.9.0                   # hard import of sglang.srt (no kernel runs here)
  apache-tvm-ffi==0.1.11          # sglang.kernels (all-reduce ops, imported by the scheduler)
  safetensors==0.8.0
  regex==2026.11.19
  pyyaml==6.0.4
  httpx2==2.16.2                  # huggingface-hub
  httpcore2==2.16.2
  truststore==0.10.5
  h11==0.16.0
  sentencepiece==0.2.1
  compressed-tensors==0.18.0      # quantization configs
  gguf==0.19.0
  einops==0.8.2
  dill==0.4.1
  loguru==0.7.3
  pydantic==2.14.4
  pydantic-core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
  msgspec==0.22.0                 # io_struct, runtime_context
  orjson==3.13.0
  pybase64==1.5.1
  psutil==7.2.2
  setproctitle==1.3.8
  pyzmq==27.3.0
  ipython==9.18.1
  traitlets==5.16.1
  httpx==0.28.1
  distro==1.9.0
  sniffio==1.3.1
  anyio==4.16.0
  partial-json-parser==0.2.1.1.post7
  fastapi==0.136.3
  starlette==1.10.0
  annotated-doc==0.0.7
  uvicorn==0.54.0
  click==8.5.1
  aiohttp==3.14.5
  aiohappyeyeballs==2.7.1
  aiosignal==1.4.0
  frozenlist==1.8.0
  multidict==7.2.1
  propcache==0.5.4
  yarl==1.25.1
  requests==2.34.2
  urllib3==2.8.0
  idna==3.20
  certifi==2026.10.19.post1
  charset-normalizer==3.5.3       # silences requests' RequestsDependencyWarning
)
# name>=floor|pin: packages tenantry itself or torch already bring; an
# installed version that meets the floor is kept, otherwise the pin goes in.
SHARED=(
  "numpy>=1.26|numpy==2.4.6"
  "attrs>=23.1|attrs==26.1.0"
  "packaging>=20.0|packaging==26.4"
  "tqdm>=4.60|tqdm==4.70.1"
  "pillow>=10|pillow==13.0.0"
  "typing-extensions>=4.10|typing-extensions==4.16.0"
  "filelock>=3.20|filelock==4.3.1"
  "fsspec>=0.8.5|fsspec==2026.9.0"
  "jinja2>=3|jinja2==3.1.6"
  "markupsafe>=2|markupsafe==3.0.4"
  "networkx>=2.5.1|networkx==3.6.1"
  "sympy>=1.13.3|sympy==1.14.0"
  "mpmath>=1.1|mpmath==1.3.0"
  # Shared with scripts/install_vllm.sh, which pins newer releases that
  # SGLang's scheduler path also imports with (checked: CI installs vLLM
  # first, then this); alone, SGLang's own pins go in.
  "transformers>=5.19.0,<5.21|transformers==5.19.0"
  "tokenizers>=0.23.1,<0.24|tokenizers==0.23.2"
  "huggingface-hub>=1.31,<3|huggingface-hub==2.4.0"
  "openai>=2.8.0|openai==2.8.0"
)

# Which of them are missing or at another version?  (pip's vendored
# `packaging` is used, so this works before anything is installed.)
TODO=$("$PYTHON" - "${PINNED[@]}" -- "${SHARED[@]}" <<'PY'
import sys
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.version import Version

args = sys.argv[1:]
cut = args.index("--")
pinned, shared = args[:cut], args[cut + 1:]

def installed(name):
    try:
        return Version(md.version(name))
    except md.PackageNotFoundError:
        return None

todo = []
for spec in pinned:
    if spec.endswith(".whl") or "/" in spec:  # a wheel path given as TORCH_SPEC
        todo.append(spec)
        continue
    req = Requirement(spec)
    have = installed(req.name)
    # `==2.13.0` matches 2.13.0+cpu as pip does (local labels are ignored).
    if have is None or not req.specifier.contains(have, prereleases=True):
        print(f"  {req.name}: {have or 'missing'} -> {spec}", file=sys.stderr)
        todo.append(spec)
for item in shared:
    floor, pin = item.split("|")
    req = Requirement(floor)
    have = installed(req.name)
    if have is None or not req.specifier.contains(have, prereleases=True):
        print(f"  {req.name}: {have or 'missing'} -> {pin}", file=sys.stderr)
        todo.append(pin)
print("\n".join(todo))
PY
)

if [ -z "$TODO" ]; then
  say "all ${#PINNED[@]} pinned and ${#SHARED[@]} shared packages already present"
else
  mapfile -t TODO_ARR <<<"$TODO"
  say "installing ${#TODO_ARR[@]} package(s) with --no-deps: ${TODO_ARR[*]}"
  # shellcheck disable=SC2086
  "$PYTHON" -m pip install --no-deps --disable-pip-version-check ${PIP_EXTRA:-} "${TODO_ARR[@]}" \
    2>&1 | grep -v "^WARNING: Location '.*' is ignored" || true
  # grep ate pip's exit status; the check below and the smoke test catch failures.
  STILL=$("$PYTHON" - "${PINNED[@]}" <<'PY'
import sys, importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.version import Version
for spec in sys.argv[1:]:
    if spec.endswith(".whl") or "/" in spec:
        spec = "torch"
    req = Requirement(spec)
    try:
        have = Version(md.version(req.name))
    except md.PackageNotFoundError:
        print(req.name); continue
    if not req.specifier.contains(have, prereleases=True):
        print(f"{req.name} ({have})")
PY
)
  if [ -n "$STILL" ]; then
    say "FAILED: still missing or wrong after pip: $(echo $STILL)"
    exit 1
  fi
fi

TORCH_VERSION=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("torch"))')
case "$TORCH_VERSION" in
  *+cpu) ;;
  *) say "warning: torch $TORCH_VERSION is not a +cpu build; a CUDA build fails to import without its nvidia-* libraries" ;;
esac

say "smoke test: build SGLang's scheduler for a tiny local Llama and run one request"
"$PYTHON" - <<'PY'
import time
t0 = time.time()
try:
    from tenantry.engines.sglang import SglangScheduler, sglang_available
except ImportError as e:  # tenantry not installed in this environment: import check only
    print(f"[install_sglang] tenantry not importable ({e}); checking the imports alone")
    import sglang.srt.managers.scheduler  # noqa: F401
    print(f"[install_sglang] ok: sglang scheduler importable ({time.time() - t0:.1f} s)")
    raise SystemExit(0)
ok, why = sglang_available()
if not ok:
    raise SystemExit(f"[install_sglang] FAILED: {why}")
s = SglangScheduler(num_blocks=64)
s.add_request(0, 40, 3)
steps, finished = 0, []
while s.has_unfinished() and steps < 20:
    finished += s.step()["finished"]
    steps += 1
assert finished == [0] and steps == 3, (finished, steps)  # prefill (first token), 2 decodes
print(f"[install_sglang] ok: {why}, one request in {steps} steps ({time.time() - t0:.1f} s)")
PY
