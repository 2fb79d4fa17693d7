"""Abusive tenant patterns: parameterised generators of adversary traffic.

Each :class:`Pattern` in :data:`PATTERNS` documents what it exploits, which
setups it should hurt, its parameter :class:`~tenantry.adversaries.space.Space`
and the objective it maximises (:mod:`tenantry.adversaries.objectives`).
:func:`make_scenario` mixes a pattern's requests with victim tenants
(:mod:`tenantry.adversaries.victims`) into one :class:`Scenario`: the workload,
every tenant's role, the run horizon, and for the prefix probe a control twin.

Adversary arrivals are evenly spaced (deterministic given the parameters), so
an objective changes smoothly with the parameters and a found workload is easy
to read; the victims carry the randomness of the seed.  Adversary requests
carry ``predicted_output_tokens`` and ``prompt_bytes`` as an honest client
would (true length, 4 bytes per token) except in ``estimate_gaming``.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

import attrs
import numpy as np

from tenantry.model.config import Config, ConfigError
from tenantry.model.workload import Request, Workload, renumber

from .space import Param, Space
from .victims import DOC_BASE, DOC_BLOCKS, NUM_DOCS, WINDOW_S, default_victims, doc_ids

#: Seconds simulated per scenario: the victims' window plus time to drain.
HORIZON_S = 16.0
#: Adversary tenant name (sybil uses ADVERSARY + index).
ADVERSARY = "adv"
#: First content id of the probe's decoy prefixes (never sent by a victim).
DECOY_BASE = DOC_BASE + 500_000


@attrs.frozen
class Scenario:
    """A workload with roles: what one evaluation simulates.

    Attributes:
        pattern: pattern name; params: its parameters; seed: the victims' seed.
        workload: adversary and victim requests, ids 0.. in arrival order.
        roles: (tenant, role) in tenant order: adversary tenants first.
        horizon_s: the run stops here (seconds).
        twin: for the prefix probe, the same scenario with every guessed
            prefix replaced by a fresh decoy (the control run), else None.
    """

    pattern: str
    params: Mapping[str, float | int]
    seed: int
    workload: Workload
    roles: tuple[tuple[str, str], ...]
    horizon_s: float = HORIZON_S
    twin: "Scenario | None" = None

    @property
    def adversaries(self) -> tuple[str, ...]:
        return tuple(t for t, r in self.roles if r == "adversary")

    @property
    def victims(self) -> tuple[str, ...]:
        return tuple(t for t, r in self.roles if r == "victim")

    def victim_workload(self) -> Workload:
        """The same workload without the adversary (the baseline run)."""
        adv = set(self.adversaries)
        return Workload(tuple(r for r in self.workload if r.tenant not in adv))

    def with_workload(self, workload: Workload, twin: "Scenario | None" = None) -> "Scenario":
        """This scenario with another workload (used by shrinking); roles kept."""
        return attrs.evolve(self, workload=workload, twin=twin)


@attrs.frozen
class Limits:
    """The limits of the replica a system claims, as the boundary requests need them
    (:func:`limits_of`).  Sizes in tokens unless named otherwise.

    Attributes:
        block_size_tokens: tokens per KV block.
        token_budget: tokens per step (a longer prompt is prefilled in chunks).
        pool_tokens: the KV pool, ``num_blocks * block_size_tokens``: a request of
            more tokens (prompt + output) can never fit.
        context_tokens: the longest prompt + output accepted (``max_context_tokens``).
        max_num_seqs: sequences per step.
        queue_bound: the adversary tenant's queue bound (requests), or None.
        kv_cap_tokens: the adversary tenant's KV cap in tokens, or None.
        token_burst_tokens: the adversary tenant's token-bucket burst, or None.
        request_burst: the adversary tenant's request-rate burst (requests), or None.
    """

    block_size_tokens: int = 16
    token_budget: int = 256
    pool_tokens: int = 65_536
    context_tokens: int = 8192
    max_num_seqs: int = 8
    queue_bound: int | None = None
    kv_cap_tokens: int | None = None
    token_burst_tokens: float | None = None
    request_burst: float | None = None


def limits_of(config: Config, tenant: str = "adv") -> Limits:
    """The :class:`Limits` of ``config`` for the adversary ``tenant`` (its per-tenant
    limits count only where the admission stage enforces them, SPEC.md 4.2)."""
    adm, B = config.admission, config.block_size_tokens
    tc = next((t for t in config.tenants if t.name == tenant), None)
    cap = tc.kv_block_cap if tc is not None and adm.kv_cap else None
    return Limits(
        block_size_tokens=B, token_budget=config.token_budget, pool_tokens=config.num_blocks * B,
        context_tokens=config.max_context_tokens, max_num_seqs=config.max_num_seqs,
        queue_bound=tc.queue_bound if tc is not None and adm.queue_bound else None,
        kv_cap_tokens=cap * B if cap is not None else None,
        token_burst_tokens=tc.token_burst_tokens if tc is not None and adm.token_bucket else None,
        request_burst=tc.request_burst if tc is not None and adm.request_rate_limit else None,
    )


#: A generator: (params, rng, limits) -> adversary requests (ids arbitrary) and its tenant names.
Generator = Callable[[Mapping[str, float | int], np.random.Generator, Limits],
                     tuple[list[Request], tuple[str, ...]]]


@attrs.frozen
class Pattern:
    """An abusive tenant pattern.

    Attributes:
        name: key in :data:`PATTERNS`.
        exploits: what it exploits, one sentence.
        hurts: setups it should hurt (names in :data:`~tenantry.runner.setups.SETUPS`);
            empty for a pattern that hurts no setup of the model and is there to drive
            a scheduler through rare paths for the checks (``cancellations``).
        objective: the metric it maximises (a key of
            :data:`~tenantry.adversaries.objectives.OBJECTIVES`).
        space: its parameters.
        generate: the generator.
        finding: objective value at or above which a cell counts as a finding
            (the adversary measurably hurt someone).
        uses_limits: the generator reads the system's :class:`Limits` (the
            scenario then depends on the configuration the system claims).
    """

    name: str
    exploits: str
    hurts: tuple[str, ...]
    objective: str
    space: Space
    generate: Generator
    finding: float
    uses_limits: bool = False


def _even(n: int, start_s: float, span_s: float) -> list[float]:
    """n arrival times spread evenly over [start_s, start_s + span_s)."""
    return [start_s + span_s * i / max(n, 1) for i in range(n)]


def _req(tenant: str, t: float, prompt: int, output: int, **kw) -> Request:
    kw.setdefault("predicted_output_tokens", output)
    kw.setdefault("prompt_bytes", 4 * prompt)
    return Request(0, tenant, round(float(t), 6), int(prompt), int(output), **kw)


def _stream(p: Mapping, rate_key: str, start_s: float, end_s: float) -> list[float]:
    n = max(1, int(math.floor((end_s - start_s) * p[rate_key])))
    return _even(n, start_s, end_s - start_s)


def gen_flood(p, rng, limits):
    """Sustained high-rate arrivals of mid-size requests."""
    end = min(WINDOW_S, p["start_s"] + p["duration_s"])
    ts = _stream(p, "rate_per_s", p["start_s"], max(end, p["start_s"] + 0.5))
    return [_req(ADVERSARY, t, p["prompt_tokens"], p["output_tokens"]) for t in ts], (ADVERSARY,)


def gen_few_huge(p, rng, limits):
    """A few very large requests (long prompt and long output) at a modest rate."""
    ts = _stream(p, "rate_per_s", 0.0, WINDOW_S)
    return [_req(ADVERSARY, t, p["prompt_tokens"], p["output_tokens"]) for t in ts], (ADVERSARY,)


def gen_slow_decoders(p, rng, limits):
    """Sequences with a large prompt and a very long output that hold KV blocks for seconds."""
    ts = _stream(p, "rate_per_s", p["start_s"], WINDOW_S)
    return [_req(ADVERSARY, t, p["prompt_tokens"], p["output_tokens"]) for t in ts], (ADVERSARY,)


def gen_churn(p, rng, limits):
    """Many tiny, short-lived requests that never hold many blocks at once."""
    ts = _stream(p, "rate_per_s", 0.0, WINDOW_S)
    return [_req(ADVERSARY, t, p["prompt_tokens"], p["output_tokens"]) for t in ts], (ADVERSARY,)


def gen_idle_burst(p, rng, limits):
    """Idle for idle_s while the victims are served, then a dense burst."""
    ts = _even(int(p["burst_n"]), p["idle_s"], p["burst_span_s"])
    return [_req(ADVERSARY, t, p["prompt_tokens"], p["output_tokens"]) for t in ts], (ADVERSARY,)


def gen_on_off(p, rng, limits):
    """Periodic on/off bursts; the on phase can be timed against the aging rate."""
    out, period, on = [], p["period_s"], p["period_s"] * p["duty"]
    t0 = 0.0
    while t0 < WINDOW_S:
        n = max(1, int(round(on * p["rate_per_s"])))
        out += [_req(ADVERSARY, t, p["prompt_tokens"], p["output_tokens"]) for t in _even(n, t0, on) if t < WINDOW_S]
        t0 += period
    return out, (ADVERSARY,)


def gen_eviction_thrash(p, rng, limits):
    """Waves of sequences whose KV grows past the pool, forcing evictions and re-prefills."""
    out = []
    for w in range(int(p["waves"])):
        t0 = p["start_s"] + w * p["wave_gap_s"]
        out += [_req(ADVERSARY, t, p["prompt_tokens"], p["output_tokens"])
                for t in _even(int(p["n"]), t0, p["spacing_s"] * int(p["n"])) if t < WINDOW_S]
    return out, (ADVERSARY,)


def probe_slots(p: Mapping, rng: np.random.Generator) -> list[tuple[float, int]]:
    """(time, guessed document) of each probe: distinct documents in a seeded order."""
    n = int(p["n_probes"])
    docs = rng.permutation(NUM_DOCS)[:n]
    return [(p["start_s"] + i * p["gap_s"], int(d)) for i, d in enumerate(docs)]


def _probe(p, rng, decoy: bool):
    out, blocks = [], int(p["prefix_blocks"])
    for i, (t, doc) in enumerate(probe_slots(p, rng)):
        if t >= WINDOW_S + 2.0:
            break
        ids = tuple(DECOY_BASE + 1000 * i + j for j in range(blocks)) if decoy else doc_ids(doc, blocks)
        out.append(_req(ADVERSARY, t, blocks * 16 + int(p["tail_tokens"]), 1, prefix_ids=ids))
    return out, (ADVERSARY,)


def gen_prefix_probe(p, rng, limits):
    """Probes whose prompt starts with a guessed victim document; the TTFT tells whether it was cached."""
    return _probe(p, rng, decoy=False)


def gen_sybil(p, rng, limits):
    """One actor split over n_ids tenant ids, each sending its share of one stream."""
    n = int(p["n_ids"])
    names = tuple(f"{ADVERSARY}{i}" for i in range(n))
    ts = _stream(p, "rate_per_s", 0.0, WINDOW_S)
    return [_req(names[k % n], t, p["prompt_tokens"], p["output_tokens"]) for k, t in enumerate(ts)], names


def gen_queue_stuffing(p, rng, limits):
    """Batches of requests sent at once, every period_s, to keep a long queue ahead of everyone."""
    out, t0 = [], 0.0
    while t0 < WINDOW_S:
        out += [_req(ADVERSARY, t0, p["prompt_tokens"], p["output_tokens"]) for _ in range(int(p["batch"]))]
        t0 += p["period_s"]
    return out, (ADVERSARY,)


def gen_estimate_gaming(p, rng, limits):
    """Requests declaring a short predicted output and few prompt bytes, to be charged less up front."""
    ts = _stream(p, "rate_per_s", 0.0, WINDOW_S)
    pred = int(round(p["predicted_fraction"] * p["output_tokens"]))
    out = [_req(ADVERSARY, t, p["prompt_tokens"], p["output_tokens"], predicted_output_tokens=pred,
                prompt_bytes=int(math.ceil(p["bytes_per_token"] * p["prompt_tokens"]))) for t in ts]
    return out, (ADVERSARY,)


#: First content id of ``replica_spreading``'s private lane prefixes (never sent by a victim).
LANE_BASE = DOC_BASE + 800_000


def herding_docs(p: Mapping) -> list[int]:
    """The victims' documents ``prefix_herding`` leads its prompts with: ``n_docs`` of them
    from ``first_doc`` on (cyclically over :data:`~tenantry.adversaries.victims.NUM_DOCS`)."""
    return [(int(p["first_doc"]) + k) % NUM_DOCS for k in range(int(p["n_docs"]))]


def gen_prefix_herding(p, rng, limits):
    """Long requests whose prompts start with the victims' shared system prompts (a public
    document such as a common system prompt), so a prefix-affinity router sends them where
    the victims' prefix is cached and the victims follow them there.

    Request k leads with document ``herding_docs(p)[k % n_docs]`` (its 16 blocks, the
    victims' content ids) then ``tail_tokens`` of its own, and asks for ``output_tokens``;
    arrivals evenly spaced from ``start_s`` to the end of the victims' window.
    """
    docs = herding_docs(p)
    ts = _stream(p, "rate_per_s", p["start_s"], WINDOW_S)
    return [_req(ADVERSARY, t, DOC_BLOCKS * 16 + int(p["tail_tokens"]), p["output_tokens"],
                 prefix_ids=doc_ids(docs[k % len(docs)])) for k, t in enumerate(ts)], (ADVERSARY,)


def gen_replica_spreading(p, rng, limits):
    """One tenant spread over the fleet: its requests lead with one of ``lanes`` private
    prompt prefixes (request k with lane ``k % lanes``'s ``prefix_blocks`` blocks, content
    ids :data:`LANE_BASE` + 1000 * lane + j), so a prefix-affinity router keeps each lane
    on the replica that first cached it, one lane per replica: on every replica the tenant
    asks for about that replica's share, and per-replica counters give it a share on each.
    A steady stream of ``rate_per_s`` mid-size requests over the victims' window.
    """
    lanes, blocks = int(p["lanes"]), int(p["prefix_blocks"])
    ts = _stream(p, "rate_per_s", 0.0, WINDOW_S)
    return [_req(ADVERSARY, t, blocks * 16 + int(p["tail_tokens"]), p["output_tokens"],
                 prefix_ids=tuple(LANE_BASE + 1000 * (k % lanes) + j for j in range(blocks)))
            for k, t in enumerate(ts)], (ADVERSARY,)


#: Slots of the free-form arrival pattern (also the Z3 search's horizon).
#: Content ids of the prompt prefix every other ``cancellations`` request shares (never a victim's).
CANCEL_PREFIX = tuple(DOC_BASE + 950_000 + j for j in range(8))


def gen_cancellations(p, rng, limits):
    """Requests their clients cancel at every stage: queued, in chunked prefill, decoding, after the end.

    The i-th request is cancelled ``cancel_after_s * 2 ** (i % 7 - 3)`` seconds after it
    arrives (a ladder from 1/8 to 8 times ``cancel_after_s``), so one run reaches every stage.
    Every other request starts with the same prefix (:data:`CANCEL_PREFIX`, up to 8 blocks):
    with a prefix cache, aborts also release blocks other requests share or will hit.
    """
    ts = _stream(p, "rate_per_s", 0.0, WINDOW_S)
    return [_req(ADVERSARY, t, p["prompt_tokens"], p["output_tokens"], prefix_ids=CANCEL_PREFIX if i % 2 == 0 else (),
                 cancel_s=round(t + p["cancel_after_s"] * 2.0 ** (i % 7 - 3), 6)) for i, t in enumerate(ts)], (ADVERSARY,)


def boundary_sizes(limits: Limits, shift: int) -> list[tuple[int, int]]:
    """(prompt, output) tokens of one round of boundary requests: each limit of ``limits``
    met at ``limit - 1 + shift``, ``limit + shift`` and ``limit + 1 + shift`` (a
    request of exactly the token budget + 1, exactly the pool, the context limit,
    the tenant's KV cap, its token burst; one block and one block + 1; outputs of
    1 token and of the whole pool).  Sizes below 1 token are dropped."""
    B, out = limits.block_size_tokens, []
    for edge in (B, limits.token_budget):
        out += [(edge + d + shift, 1) for d in (-1, 0, 1)]  # a prompt at a block or chunk edge
    totals = [limits.pool_tokens, limits.context_tokens]
    if limits.kv_cap_tokens is not None:
        totals.append(limits.kv_cap_tokens)
    for total in totals:  # prompt + output at a size limit, output 1 and output B + 1
        for d in (-1, 0, 1):
            out += [(total + d + shift - 1, 1), (total + d + shift - B - 1, B + 1)]
    if limits.token_burst_tokens is not None:
        burst = int(limits.token_burst_tokens)
        out += [(burst + d + shift, 1) for d in (-1, 0, 1)]
    return [(pr, o) for pr, o in out if pr >= 1]


#: Content id of the one-block prompt of ``boundary``'s bursts (never sent by a victim).
BOUNDARY_BLOCK_ID = DOC_BASE + 900_000


def gen_boundary(p, rng, limits):
    """Requests sized at the limits the system claims (:func:`boundary_sizes`), then a burst
    of ``max_num_seqs + 1`` (and queue bound + 1, request burst + 1) small requests at one instant.

    The bursts' prompts are exactly one KV block, all with one content id, so with a prefix
    cache a later one's whole prompt is cached: the limit of a cache hit (the last prompt
    token must still be computed, to sample the first output token; SPEC.md 4.6)."""
    sizes = boundary_sizes(limits, int(p["shift"]))
    t, out = p["start_s"], []
    for _ in range(int(p["rounds"])):
        for prompt, output in sizes:
            out.append(_req(ADVERSARY, t, min(prompt, MAX_BOUNDARY_TOKENS), output))
            t += p["gap_s"]
        bursts = [limits.max_num_seqs] + [int(b) for b in (limits.queue_bound, limits.request_burst) if b is not None]
        for n in bursts:  # prompts of exactly one block, all of one content: from the second burst on it is cached
            out += [_req(ADVERSARY, t, limits.block_size_tokens, 2, prefix_ids=(BOUNDARY_BLOCK_ID,))
                    for _ in range(n + 1 + int(p["shift"]))]
            t += p["gap_s"]
    return [r for r in out if r.arrival_s < WINDOW_S], (ADVERSARY,)


#: The largest boundary prompt sent (tokens): a pool of millions of tokens is met by the
#: refusal of a request larger than this cap, not by prefilling it.
MAX_BOUNDARY_TOKENS = 1 << 20


SLOTS = 8
SLOT_S = 1.5
TIMED_PROMPT, TIMED_OUTPUT = 256, 32


def gen_timed_arrivals(p, rng, limits):
    """Free-form arrivals: c_k requests of a fixed shape in slot k (the space Z3 searches)."""
    out = []
    for k in range(SLOTS):
        out += [_req(ADVERSARY, t, TIMED_PROMPT, TIMED_OUTPUT) for t in _even(int(p[f"c{k}"]), k * SLOT_S, SLOT_S)]
    return out, (ADVERSARY,)


P = Param


def cancelling(space: Space) -> Space:
    """``space`` with the client-cancellation parameters every traffic pattern has:
    ``cancel_fraction`` of the adversary's requests (spread evenly; default 0: none)
    are cancelled ``cancel_after_s`` seconds after they arrive (applied by :func:`make_scenario`)."""
    return Space(list(space.params) + [P("cancel_fraction", 0, 1, 0), P("cancel_after_s", 0.01, 4, 0.2, log=True)])


def with_cancellations(adv: list[Request], p: Mapping[str, float | int]) -> list[Request]:
    """Apply ``cancel_fraction`` / ``cancel_after_s`` of ``p`` (if any) to the adversary's requests."""
    f = float(p.get("cancel_fraction", 0.0))
    if f <= 0:
        return adv
    return [attrs.evolve(r, cancel_s=round(r.arrival_s + p["cancel_after_s"], 6))
            if math.floor((i + 1) * f) > math.floor(i * f) and r.cancel_s is None else r for i, r in enumerate(adv)]


PATTERNS: dict[str, Pattern] = {p.name: p for p in (
    Pattern("flood", "arrival-order service and unbounded queues: a sustained stream ahead of everyone",
            ("fcfs", "priority", "rate_limit"), "ttft_p99_inflation",
            cancelling(Space([P("rate_per_s", 2, 60, 30, log=True), P("prompt_tokens", 16, 1024, 256, True, True),
                              P("output_tokens", 1, 64, 32, True, True), P("start_s", 0, 6, 0), P("duration_s", 1, 12, 12)])),
            gen_flood, 20.0),
    Pattern("few_huge", "request-count fairness: few huge requests against many small ones",
            ("round_robin", "rate_limit", "fcfs"), "contended_share",
            cancelling(Space([P("rate_per_s", 0.2, 4, 1.5, log=True), P("prompt_tokens", 256, 3000, 2000, True, True),
                              P("output_tokens", 16, 400, 200, True, True)])),
            gen_few_huge, 0.6),
    Pattern("slow_decoders", "token-fair accounting that does not charge for KV held: long outputs pin blocks and slots",
            ("vtc", "drr_tokens", "fcfs", "round_robin"), "ttft_p99_inflation",
            cancelling(Space([P("rate_per_s", 0.2, 4, 1.0, log=True), P("prompt_tokens", 256, 3000, 1500, True, True),
                              P("output_tokens", 64, 400, 300, True, True), P("start_s", 0, 6, 0)])),
            gen_slow_decoders, 10.0),
    Pattern("churn", "per-block fairness and victim choice: many short-lived sequences never hold much at once",
            ("drr_block_seconds", "protected_drr", "round_robin"), "contended_share",
            cancelling(Space([P("rate_per_s", 5, 80, 40, log=True), P("prompt_tokens", 16, 128, 32, True, True),
                              P("output_tokens", 1, 4, 1, True)])),
            gen_churn, 0.6),
    Pattern("idle_burst", "banked credit: a counter left low while idle buys exclusive service on return",
            ("vtc_nolift",), "service_gap",
            cancelling(Space([P("idle_s", 2, 10, 8), P("burst_n", 5, 160, 120, True, True), P("burst_span_s", 0.1, 3, 0.5, log=True),
                              P("prompt_tokens", 16, 1024, 64, True, True), P("output_tokens", 4, 64, 64, True, True)])),
            gen_idle_burst, 4.0),
    Pattern("on_off_aging", "priority aging thresholds: bursts timed so the higher tier is always backlogged",
            ("priority", "aging"), "starvation_s",
            cancelling(Space([P("period_s", 0.5, 6, 3), P("duty", 0.1, 0.95, 0.8), P("rate_per_s", 5, 60, 30, log=True),
                              P("prompt_tokens", 32, 512, 128, True, True), P("output_tokens", 4, 64, 16, True, True)])),
            gen_on_off, 2.0),
    Pattern("eviction_thrash", "preemption by recompute without hysteresis: the newest sequence is evicted again and again",
            ("no_hysteresis", "vtc", "fcfs"), "max_evictions",
            cancelling(Space([P("n", 2, 8, 5, True), P("prompt_tokens", 256, 3000, 1500, True, True),
                              P("output_tokens", 64, 800, 400, True, True), P("spacing_s", 0.0, 0.5, 0.05),
                              P("waves", 1, 3, 1, True), P("wave_gap_s", 1, 6, 4), P("start_s", 0, 4, 0)])),
            gen_eviction_thrash, 5.0),
    Pattern("prefix_probe", "a shared prefix cache: a cached guess answers faster (a timing side channel)",
            ("shared_cache",), "probe_auc",
            Space([P("n_probes", 6, NUM_DOCS, NUM_DOCS, True), P("prefix_blocks", 2, DOC_BLOCKS, DOC_BLOCKS, True),
                   P("tail_tokens", 16, 256, 16, True, True), P("gap_s", 0.1, 1.0, 0.4, log=True),
                   P("start_s", 0.5, 6, 3)]),
            gen_prefix_probe, 0.8),
    Pattern("sybil", "per-tenant fairness: one actor split over many tenant ids gets many shares",
            ("vtc", "drr_block_seconds", "round_robin", "rate_limit", "protected", "protected_drr", "protected_slots"),
            "contended_share",
            cancelling(Space([P("n_ids", 2, 8, 6, True), P("rate_per_s", 4, 60, 30, log=True),
                              P("prompt_tokens", 32, 1024, 256, True, True), P("output_tokens", 4, 64, 32, True, True)])),
            gen_sybil, 0.6),
    Pattern("queue_stuffing", "unbounded queues: batches of requests parked ahead of everyone else",
            ("fcfs", "priority"), "ttft_p99_inflation",
            cancelling(Space([P("batch", 5, 200, 100, True, True), P("period_s", 0.5, 6, 3),
                              P("prompt_tokens", 16, 512, 128, True, True), P("output_tokens", 1, 64, 16, True, True)])),
            gen_queue_stuffing, 20.0),
    Pattern("estimate_gaming", "charges made from client estimates: a tiny predicted output and prompt byte count",
            ("vtc_predict",), "contended_share",
            cancelling(Space([P("rate_per_s", 1, 30, 8, log=True), P("prompt_tokens", 64, 2048, 1024, True, True),
                              P("output_tokens", 16, 256, 128, True, True), P("predicted_fraction", 0, 1, 0),
                              P("bytes_per_token", 0.25, 4, 0.25, log=True)])),
            gen_estimate_gaming, 0.6),
    Pattern("timed_arrivals", "any timing weakness: free-form arrival counts per 1.5-s slot (searched by Z3 too)",
            ("vtc_nolift", "priority", "fcfs"), "starvation_s",
            Space([P(f"c{k}", 0, 16, 0 if k < SLOTS // 2 else 16, True) for k in range(SLOTS)]),
            gen_timed_arrivals, 2.0),
    Pattern("cancellations", "cancellation at every stage: clients abort requests queued, mid-prefill, decoding and after the end",
            (), "ttft_p99_inflation",
            Space([P("rate_per_s", 1, 40, 8, log=True), P("prompt_tokens", 16, 3000, 1024, True, True),
                   P("output_tokens", 1, 256, 64, True, True), P("cancel_after_s", 0.01, 2, 0.1, log=True)]),
            gen_cancellations, 20.0),
    Pattern("boundary", "off-by-one limits: requests of exactly the token budget + 1, the pool, the context limit, "
            "the KV cap and the burst, and bursts one past max_num_seqs and the queue bound",
            ("fcfs", "rate_limit"), "starvation_s",
            Space([P("shift", -1, 1, 0, True), P("gap_s", 0.02, 1, 0.1, log=True), P("rounds", 1, 3, 1, True),
                   P("start_s", 0, 4, 0.5)]),
            gen_boundary, 2.0, uses_limits=True),
    Pattern("prefix_herding", "prefix-affinity routing: long requests led by the victims' shared system prompt are "
            "sent where it is cached, and the victims that share it follow them there (the load bound spills the "
            "pile; the long decoders hold slots wherever they land)",
            ("fleet_rr", "fleet_least_kv", "fleet_prefix_affinity", "fleet_prefix_affinity_fleetacct"),
            "ttft_p99_inflation",
            cancelling(Space([P("rate_per_s", 0.2, 8, 1, log=True), P("n_docs", 1, NUM_DOCS, 1, True),
                              P("first_doc", 0, NUM_DOCS - 1, 0, True), P("tail_tokens", 16, 2048, 512, True, True),
                              P("output_tokens", 16, 400, 300, True, True), P("start_s", 0, 6, 1)])),
            gen_prefix_herding, 10.0),
    Pattern("replica_spreading", "per-replica fairness in a fleet: one tenant whose private prefixes keep a lane of "
            "its traffic on every replica gets a share on each, against victims that queue on a few",
            ("fleet_rr", "fleet_least_kv", "fleet_prefix_affinity"), "service_gap",
            cancelling(Space([P("lanes", 1, 8, 4, True), P("prefix_blocks", 1, 8, 4, True),
                              P("rate_per_s", 2, 60, 20, log=True), P("tail_tokens", 16, 1024, 192, True, True),
                              P("output_tokens", 4, 128, 32, True, True)])),
            gen_replica_spreading, 8.0),
)}


def get_pattern(name: str) -> Pattern:
    """The pattern called ``name``.

    Raises:
        ConfigError: naming the unknown pattern and listing the known ones.
    """
    try:
        return PATTERNS[name]
    except KeyError:
        raise ConfigError("pattern", name, f"unknown pattern; choose from {', '.join(PATTERNS)}") from None


def _compose(adv: list[Request], victims: tuple[Request, ...]) -> Workload:
    return Workload(renumber([r for r in adv if r.arrival_s < HORIZON_S] + list(victims)))


def make_scenario(pattern: str, params: Mapping[str, float | int] | None, seed: int, *,
                  victims: str = "excerpt", limits: Limits | None = None) -> Scenario:
    """The scenario of ``pattern`` with ``params`` (missing ones at their default) and the
    default victims of ``seed``, from the packaged trace excerpts (``victims="excerpt"``)
    or the full traces in ../shared/traces (``"shared"``).  ``limits``: the system's
    (:func:`limits_of`), read by the patterns with ``uses_limits``; default
    :class:`Limits` (the search replica's).

    Raises:
        ConfigError: on an unknown pattern or parameter name.
    """
    pat = get_pattern(pattern)
    full = pat.space.complete(params)
    victim_reqs = default_victims(seed, source=victims)
    adv, names = pat.generate(full, np.random.default_rng(np.random.SeedSequence([seed, 7])), limits or Limits())
    adv = with_cancellations(adv, full)
    vnames = tuple(dict.fromkeys(r.tenant for r in victim_reqs))
    roles = tuple((n, "adversary") for n in names) + tuple((n, "victim") for n in vnames)
    twin = None
    if pattern == "prefix_probe":
        control, _ = _probe(full, np.random.default_rng(np.random.SeedSequence([seed, 7])), decoy=True)
        twin = Scenario(pattern, full, seed, _compose(control, victim_reqs), roles)
    return Scenario(pattern, full, seed, _compose(adv, victim_reqs), roles, twin=twin)


def scenario_from_workload(workload: Workload, adversaries: tuple[str, ...], *, victims: tuple[str, ...] | None = None,
                           pattern: str = "replay", seed: int = 0, horizon_s: float = HORIZON_S) -> Scenario:
    """A scenario for a given workload (e.g. a file read back): tenants in
    ``adversaries`` are the adversary, the others victims, in the order of
    ``victims`` when given (tenant order is part of the configuration: it breaks
    ties), else in order of first arrival.

    Raises:
        ConfigError: if no request comes from an adversary tenant (unless ``victims``
            is given: then every tenant is named, and a shrunk witness may have lost
            the adversary's requests), or ``victims`` misses a tenant of the workload.
    """
    names = workload.tenants
    if victims is None and not set(adversaries) & set(names):
        raise ConfigError("adversaries", adversaries, f"no request from them; tenants are {', '.join(names)}")
    rest = tuple(n for n in names if n not in adversaries)
    if victims is not None:
        missing = [n for n in rest if n not in victims]
        if missing:
            raise ConfigError("victims", victims, f"tenant {missing[0]} of the workload is not listed")
        rest = tuple(victims)
    roles = tuple((n, "adversary") for n in adversaries) + tuple((n, "victim") for n in rest)
    return Scenario(pattern, {}, seed, workload, roles, horizon_s=horizon_s)
