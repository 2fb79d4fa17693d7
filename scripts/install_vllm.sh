#!/usr/bin/env bash
# Install vLLM 0.33.0's V1 scheduler, CPU-only, into the current Python
# environment (whatever `$PYTHON -m pip` installs into; PYTHON defaults to
# `python`, else `python3`), for tenantry.engines.vllm.
#
#   bash scripts/install_vllm.sh                 # the active venv's python
#   PYTHON=/path/to/venv/bin/python bash scripts/install_vllm.sh
#
# vLLM's own requirements pull CUDA torch, triton, flashinfer and ~9 GB more;
# the scheduler path needs none of it.  So: torch 2.13.0 (the CPU build; vLLM
# pins 2.14.0 but its scheduler does not care), vllm and xgrammar with
# --no-deps (xgrammar's deps would bring 1 GB of triton), and then exactly the
# packages that `import vllm.v1.core.sched.scheduler`, `vllm.config` and the
# Llama model class (which vLLM's ModelConfig inspects) import, found by
# iterating on ImportError in a fresh venv, each pinned and installed with
# --no-deps.  The result is about 2.2 GB, of which torch is most.
#
# Idempotent: only what is missing or at another version is installed; a run
# with nothing to do makes no pip call.  Ends with a smoke test that imports
# the scheduler and builds a ModelConfig for a tiny local Llama (no network).
# Exits non-zero if anything fails.
set -euo pipefail

PYTHON=${PYTHON:-$(command -v python || command -v python3)}
say() { printf '[install_vllm] %s\n' "$*"; }
say "python: $PYTHON ($("$PYTHON" -c 'import sys; print(sys.version.split()[0], sys.prefix)'))"

# torch: the +cpu wheel.  On this workplace's machines pip finds it on local
# disk (find-links in pip's config); elsewhere set TORCH_SPEC, e.g. to a local
# wheel path, or add --index-url for the PyTorch CPU index via PIP_EXTRA.
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

# name==version, installed with --no-deps.  Grouped by who needs them.
PINNED=(
  "$TORCH_SPEC"
  vllm==0.33.0
  xgrammar==0.2.8
  apache-tvm-ffi==0.1.11          # xgrammar (structured output, imported by Request)
  llguidance==1.7.6
  partial-json-parser==0.2.1.1.post7
  oss-harmony==0.0.11             # provides openai_harmony
  einops==0.8.2                   # the Llama class ModelConfig inspects
  pydantic==2.14.4                # vllm.config
  pydantic-core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
  regex==2026.11.19
  cbor2==6.3.0
  psutil==7.2.2
  pyzmq==27.3.0
  msgspec==0.22.0
  cachetools==8.0.2
  cloudpickle==3.1.3
  pybase64==1.5.1
  py-cpuinfo==9.0.0
  prometheus-client==0.26.0
  uvloop==0.23.0
  transformers==5.20.2            # vllm needs >=5.16.1,<5.21
  huggingface-hub==2.4.0
  tokenizers==0.23.3
  safetensors==0.8.0
  pyyaml==6.0.4
  openai==3.57.0
  httpx2==2.16.2
  httpcore2==2.16.2
  h11==0.16.0
  truststore==0.10.5
  anyio==4.16.0
  sniffio==1.3.1
  idna==3.20
  fastapi==0.136.3
  starlette==1.10.0
  annotated-doc==0.0.7
  aiohttp==3.14.5
  aiohappyeyeballs==2.7.1
  aiosignal==1.4.0
  frozenlist==1.8.0
  multidict==7.2.1
  propcache==0.5.4
  yarl==1.25.1
  requests==2.34.2
  urllib3==2.8.0
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

say "smoke test: import the V1 scheduler and build a ModelConfig for a tiny local Llama"
"$PYTHON" - <<'PY'
import json, os, tempfile, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import logging
logging.getLogger("vllm").setLevel(logging.ERROR)  # e.g. "no vllm._C": not used here
t0 = time.time()
import vllm
from vllm.config import DeviceConfig, ModelConfig
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401
import vllm.model_executor.models.llama  # noqa: F401  (needs einops)
with tempfile.TemporaryDirectory() as d:
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
               "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
               "num_key_value_heads": 4, "num_hidden_layers": 1, "vocab_size": 32000,
               "max_position_embeddings": 4096},
              open(os.path.join(d, "config.json"), "w"))
    ModelConfig(model=d, tokenizer=d, skip_tokenizer_init=True, dtype="float32")
    DeviceConfig(device="cpu")
print(f"[install_vllm] ok: vllm {vllm.__version__} scheduler importable ({time.time() - t0:.1f} s)")
PY
