"""Victim tenants: the honest traffic an adversary is mixed with.

The default mix (:data:`DEFAULT_VICTIMS`) is three tenants:

* ``chat``: a light interactive tenant, synthetic Poisson arrivals (1 req/s,
  160-token prompts, 16 output tokens);
* ``conv``: the Azure LLM inference trace 2023, conversation service (Patel et
  al., "Splitwise", ISCA 2024), arrivals as recorded in a window of the trace,
  token counts scaled by 1/8 to fit the small replica, each prompt led by one
  of a few shared 256-token system prompts ("documents") whose blocks are
  cacheable prefix content;
* ``code``: the same trace's code service, scaled the same way (long prompts,
  a few output tokens).

Trace tenants are slowed down (conv to a quarter of its speed, code to half)
with token counts scaled by 1/16, so that each victim asks for well under its
fair share of the small replica (together about a quarter of it): a victim that suffers under
a fair policy then suffers because of the adversary, not because of its own
demand.

Traces come from the excerpts shipped in the package (the first 10 minutes of
each file) unless ``source="shared"`` names the full files in
``../shared/traces``.  The window's start within the trace and every
synthetic choice come from ``np.random.default_rng(seed)``: the same seed gives
the same requests.  Every victim request carries an honest
``predicted_output_tokens`` (its true length) and ``prompt_bytes`` of 4 bytes
per token, which only matter to ``vtc_predict`` and the byte-estimate bucket.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import attrs
import numpy as np

from tenantry.model.config import ConfigError
from tenantry.model.workload import Request
from tenantry.runner.traces import excerpt_path, poisson_tenant, read_azure_csv

#: First content id of the victims' shared system prompts; document k, block j
#: has content id DOC_BASE + 1000 * k + j.  The prefix probe guesses these.
DOC_BASE = 1_000_000
#: Number of system prompts ("documents") the conv tenant uses, and their length in blocks.
NUM_DOCS = 24
DOC_BLOCKS = 16
#: Seconds of victim arrivals in a scenario.
WINDOW_S = 12.0
#: Length of the packaged excerpts (seconds).
EXCERPT_S = 585.0
_SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


@attrs.frozen
class VictimSpec:
    """One victim tenant.

    Attributes:
        name: tenant name.
        source: ``poisson`` (synthetic), ``azure_conv`` or ``azure_code``.
        rate_per_s, prompt_tokens, output_tokens: for ``poisson`` (req/s, tokens).
        prompt_scale, output_scale: factors applied to a trace's token counts.
        speedup: trace time compression (0.5 replays at half speed).
        max_prompt_tokens, max_output_tokens: clamps after scaling (tokens).
        docs: prefix each prompt with one of :data:`NUM_DOCS` shared documents.
    """

    name: str
    source: str
    rate_per_s: float = 1.0
    prompt_tokens: int = 160
    output_tokens: int = 16
    prompt_scale: float = 0.0625
    output_scale: float = 0.0625
    speedup: float = 0.5
    max_prompt_tokens: int = 1024
    max_output_tokens: int = 64
    docs: bool = False


DEFAULT_VICTIMS: tuple[VictimSpec, ...] = (
    VictimSpec("chat", "poisson", rate_per_s=1.0, prompt_tokens=160, output_tokens=16),
    VictimSpec("conv", "azure_conv", docs=True, speedup=0.25),
    VictimSpec("code", "azure_code"),
)


def doc_ids(doc: int, blocks: int = DOC_BLOCKS) -> tuple[int, ...]:
    """Content ids of the first ``blocks`` blocks of shared document ``doc``."""
    return tuple(DOC_BASE + 1000 * doc + j for j in range(blocks))


def require_shared() -> None:
    """Check that ``--victims shared`` can run: the full Azure traces are in ``../shared/traces``.

    Raises:
        ConfigError: naming the flag and the missing file.
    """
    for name in ("conv", "code"):
        path = _SHARED / f"azure_llm_2023_{name}.csv"
        if not path.exists():
            raise ConfigError("--victims", "shared", f"{path} not found; use --victims excerpt")


@functools.lru_cache(maxsize=8)
def _trace(name: str, source: str) -> tuple[Request, ...]:
    if source == "shared":
        path = _SHARED / f"azure_llm_2023_{name}.csv"
        if not path.exists():
            raise ConfigError("--victims", "shared", f"{path} not found; use --victims excerpt")
    elif source == "excerpt":
        path = excerpt_path(name)
    else:
        raise ConfigError("victims", source, "trace source must be 'excerpt' or 'shared'")
    return read_azure_csv(path, name)


def _scaled(n: int, scale: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, math.ceil(n * scale))))


def victim_requests(spec: VictimSpec, seed: int, window_s: float = WINDOW_S,
                    source: str = "excerpt") -> tuple[Request, ...]:
    """One victim tenant's requests on [0, window_s) seconds.

    Trace tenants take the arrivals of a window of the trace starting at a
    seeded request's arrival, shifted to 0 and divided by ``speedup``.  Ids are 0, 1, ... (callers renumber).

    Raises:
        ConfigError: on an unknown source or a missing shared trace.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, _stable(spec.name)]))
    if spec.source == "poisson":
        reqs = list(poisson_tenant(spec.name, spec.rate_per_s, spec.prompt_tokens, spec.output_tokens,
                                   window_s, seed=int(rng.integers(2**31))))
    elif spec.source in ("azure_conv", "azure_code"):
        trace = _trace(spec.source.split("_")[1], source)
        span_s = window_s * spec.speedup
        # The window starts at a seeded request (never in a gap of the trace).
        late = [r.arrival_s for r in trace if r.arrival_s <= trace[-1].arrival_s - span_s] or [0.0]
        start = late[int(rng.integers(len(late)))]
        reqs = []
        for r in trace:
            if start <= r.arrival_s < start + span_s:
                reqs.append(Request(
                    len(reqs), spec.name, round((r.arrival_s - start) / spec.speedup, 6),
                    _scaled(r.prompt_tokens, spec.prompt_scale, 16, spec.max_prompt_tokens),
                    _scaled(r.output_tokens, spec.output_scale, 1, spec.max_output_tokens),
                ))
    else:
        raise ConfigError("source", spec.source, f"victim {spec.name}: choose poisson, azure_conv or azure_code")
    out = []
    for r in reqs:
        prompt, prefix = r.prompt_tokens, ()
        if spec.docs:
            doc = int(rng.integers(NUM_DOCS))
            prompt += DOC_BLOCKS * 16
            prefix = doc_ids(doc)
        out.append(attrs.evolve(r, prompt_tokens=prompt, prefix_ids=prefix,
                                predicted_output_tokens=r.output_tokens, prompt_bytes=4 * prompt))
    return tuple(out)


def _stable(name: str) -> int:
    """A stable integer for a name (Python's hash() is salted per process)."""
    return int.from_bytes(name.encode("utf-8")[:8].ljust(8, b"\0"), "big")


@functools.lru_cache(maxsize=64)
def default_victims(seed: int, window_s: float = WINDOW_S, source: str = "excerpt") -> tuple[Request, ...]:
    """The requests of every tenant of :data:`DEFAULT_VICTIMS` (ids not yet unique)."""
    return tuple(r for spec in DEFAULT_VICTIMS for r in victim_requests(spec, seed, window_s, source))
