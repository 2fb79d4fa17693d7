"""Configuration of the reference model: the replica, its tenants and its policies.

Every value is immutable (attrs frozen classes) and validated when built, so a
bad configuration fails at construction with a :class:`ConfigError` that names
the field and the value, never later inside the step function.

Units are in the field names: ``*_tokens``, ``*_blocks``, ``*_s`` (seconds),
``*_steps``, ``*_per_s``.  SPEC.md section 2 is the normative description.

It also holds how a value is shown to a user (:class:`ConfigError`, :func:`excerpt`,
:func:`readable_number`), once for every layer above the model: the reason it runs past
500 lines.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

#: Scheduling-order policies (SPEC.md 4.3).  Registered in :mod:`tenantry.model.policies`.
ORDER_POLICIES = (
    "fcfs",
    "round_robin",
    "vtc",
    "vtc_predict",
    "drr_tokens",
    "drr_block_seconds",
    "priority",
    "aging",
    "floors",
)
#: Order policies the skip budget (``OrderConfig.guard_skips``) is defined for: it counts
#: picks past a lower VTC counter, or (``floors``) a lower tier counter, or (``drr_tokens``,
#: ``drr_block_seconds``) DRR refills past a blocked tenant that needed fewer rounds (SPEC.md 4.3).
SKIP_POLICIES = ("vtc", "vtc_predict", "floors", "drr_tokens", "drr_block_seconds")
#: Eviction victim policies (SPEC.md 4.5).
VICTIM_POLICIES = ("largest", "newest", "lowest_priority", "most_over_share")
#: Prefix-cache modes (SPEC.md 4.6).
PREFIX_CACHE_MODES = ("off", "shared", "salted")
#: Cost-model modes (SPEC.md 4.7).
COST_MODES = ("roofline", "unit")
#: How the token bucket charges a prompt at admission (SPEC.md 4.2).
PROMPT_ESTIMATES = ("tokens", "bytes")


#: Longest text a :class:`ConfigError` message shows of a value (or a field name) in full;
#: a longer one is shown as its first :data:`EXCERPT_HEAD` characters, '...' and its length.
EXCERPT_LIMIT, EXCERPT_HEAD = 80, 60


def excerpt(text: str) -> str:
    """``text`` itself when at most :data:`EXCERPT_LIMIT` characters, else its first
    :data:`EXCERPT_HEAD` characters, ``...`` and its length, e.g. ``'xxxx...' (100,002 chars)``
    (an error message quoting a 100 kB value stays one short line)."""
    if len(text) <= EXCERPT_LIMIT:
        return text
    return f"{text[:EXCERPT_HEAD]}... ({len(text):,} chars)"


#: Magnitude from which :func:`readable_number` writes a number with an exponent.
READABLE_MAX = 1e15


def readable_number(x: Any, spec: str = "g") -> str:
    """``format(x, spec)`` (``spec`` such as ``".1f"`` or ``",.0f"``) for a number of magnitude
    below :data:`READABLE_MAX`, so that ordinary output is unchanged; a larger one in three
    significant digits with an exponent (``1e+300``, ``-1.23e+20``), integers beyond a float's
    range included: ``f"{1e300:.1f}"`` is a 302-character number no reader can use.  inf and
    nan, and anything not a number, as ``format`` writes them."""
    import numbers

    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not abs(x) >= READABLE_MAX or x in (
            float("inf"), float("-inf")):
        return format(x, spec)
    try:
        return format(float(x), ".3g")
    except OverflowError:  # an integer beyond a float's range
        digits = str(abs(int(x)))
        mantissa = f"{digits[0]}.{digits[1:3]}".rstrip("0").rstrip(".")
        return f"{'-' if x < 0 else ''}{mantissa}e+{len(digits) - 1}"


class ConfigError(ValueError):
    """A configuration or workload value is invalid.

    ``str(err)`` is one line naming where (file, line, field) and the value:
    ``where: field=value: why``, or ``where: why`` for an error of the whole file
    (``field`` empty).  A long value or field is shown as an :func:`excerpt` of its
    repr, but for a ``path`` or a command-line flag's value (``--...``), shown whole;
    the parts are kept whole as attributes ``where``, ``field`` and ``value``.
    """

    def __init__(self, field: str, value: Any, why: str, where: str = "") -> None:
        self.where, self.field, self.value, self.why = where, field, value, why
        prefix = f"{where}: " if where else ""
        whole = field == "path" or field.startswith("--")  # a path, or what the user typed on the command line
        shown = repr(value) if whole else excerpt(repr(value))
        if isinstance(value, int) and not isinstance(value, bool) and len(repr(value)) > EXCERPT_LIMIT:
            shown = f"{readable_number(value)} (an integer of {len(str(abs(value))):,} digits)"
        what = f"{excerpt(field)}={shown}: " if field else ""
        super().__init__(f"{prefix}{what}{why}")

    def __reduce__(self):
        # Picklable with its parts, so an error raised in a worker process
        # reaches the parent as itself (not as a BrokenProcessPool).
        return (type(self), (self.field, self.value, self.why, self.where))


def _positive(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise ConfigError(attribute.name, value, "must be a positive finite number")


def _non_negative(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or not math.isfinite(value):
        raise ConfigError(attribute.name, value, "must be a non-negative finite number")


def _positive_int(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(attribute.name, value, "must be a positive integer")


def _non_negative_int(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(attribute.name, value, "must be a non-negative integer")


def _flag(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool):  # a TOML string "false" would otherwise read as on
        raise ConfigError(attribute.name, value, "must be true or false")


def _one_of(options: tuple[str, ...]):
    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value not in options:
            raise ConfigError(attribute.name, value, f"unknown; choose one of {', '.join(options)}")

    return check


@attrs.frozen
class TenantConfig:
    """One tenant: the party whose share is accounted.

    Attributes:
        name: unique tenant id (non-empty string).
        weight: fair-share weight (> 0); a tenant with weight 2 is entitled to
            twice the weighted service of a tenant with weight 1 (VTC, DRR).
        tier: priority tier, 0 is the highest (vLLM's convention: lower runs first).
        queue_bound: most requests waiting in the tenant's queue; an arrival
            that finds it full is refused with ``queue_full``.  None: unbounded.
        kv_block_cap: most KV blocks the tenant's sequences may hold at once.
            None: only the pool bounds it.
        token_rate_per_s, token_burst_tokens: token bucket (tokens/s, tokens);
            both None disables the bucket for this tenant.
        request_rate_per_s, request_burst: request-rate limit (requests/s,
            requests); the naive baseline.
        cache_salt: value mixed into this tenant's prefix-cache keys when the
            cache is ``salted``.  Default: the tenant name.
        max_wait_s: the wait this tenant's requests are promised (seconds from
            arrival to first scheduling; the BOUNDED-WAIT claim, SPEC.md 7.2).
            None: no promise.
        max_running_seqs: most of this tenant's sequences in the batch at once
            (sequences; batch slots), enforced with ``admission.slot_cap``.  A
            head that would exceed it is skipped like one that does not fit
            (SPEC.md 4.3).  None: only ``max_num_seqs`` bounds it.
        slo_ttft_s, slo_tpot_s: the tenant's service-level targets (seconds): its
            TTFT p99 and its TPOT p99 (time per output token after the first) at
            most these.  Read by measurements only (the ``victims_outside_slo``
            objective, ``tenantry study batch-size``); the model schedules without
            them.  None: no target on that measure.
    """

    name: str = attrs.field()
    weight: float = attrs.field(default=1.0, validator=_positive)
    tier: int = attrs.field(default=0, validator=_non_negative_int)
    queue_bound: int | None = attrs.field(default=None, validator=_non_negative_int)
    kv_block_cap: int | None = attrs.field(default=None, validator=_positive_int)
    token_rate_per_s: float | None = attrs.field(default=None, validator=_positive)
    token_burst_tokens: float | None = attrs.field(default=None, validator=_positive)
    request_rate_per_s: float | None = attrs.field(default=None, validator=_positive)
    request_burst: float | None = attrs.field(default=None, validator=_positive)
    cache_salt: str | None = attrs.field(default=None)
    max_wait_s: float | None = attrs.field(default=None, validator=_positive)
    max_running_seqs: int | None = attrs.field(default=None, validator=_positive_int)
    slo_ttft_s: float | None = attrs.field(default=None, validator=_positive)
    slo_tpot_s: float | None = attrs.field(default=None, validator=_positive)

    @name.validator
    def _check_name(self, attribute: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, str) or not value.strip():
            raise ConfigError("name", value, "tenant name must be a non-empty string")

    def __attrs_post_init__(self) -> None:
        if (self.token_rate_per_s is None) != (self.token_burst_tokens is None):
            raise ConfigError(
                "token_rate_per_s/token_burst_tokens",
                (self.token_rate_per_s, self.token_burst_tokens),
                f"give both or neither (tenant {excerpt(repr(self.name))})",
            )
        if (self.request_rate_per_s is None) != (self.request_burst is None):
            raise ConfigError(
                "request_rate_per_s/request_burst",
                (self.request_rate_per_s, self.request_burst),
                f"give both or neither (tenant {excerpt(repr(self.name))})",
            )

    @property
    def salt(self) -> str:
        """The cache salt in force (the tenant name unless set)."""
        return self.name if self.cache_salt is None else self.cache_salt


@attrs.frozen
class OrderConfig:
    """Scheduling order: which backlogged tenant's request enters the batch next.

    Attributes:
        policy: one of :data:`ORDER_POLICIES`.
        w_in, w_out: VTC / DRR-token weights per prompt and per output token
            (Sheng et al., OSDI 2024, section 4: cost h(n_in, n_out) = w_in*n_in + w_out*n_out).
        lift: VTC counter lift (a tenant that becomes backlogged is raised to
            the least counter among backlogged tenants).  Turning it off is the
            banked-credit bug the suite must catch.
        drr_quantum: DRR quantum per round, in the DRR unit (weighted tokens or
            block-seconds), scaled by the tenant weight.
        drr_carry_bound: most deficit carried across rounds (same unit); None
            means unbounded (the mutant).  Must be at least ``drr_quantum``;
            the DRR service bound (SPEC.md 7.2) also needs it at least
            ``drr_quantum`` times the largest tenant weight, else the cap cuts
            a heavy tenant's refill and its share falls toward the others'
            (allowed, because the proofs' twin replays exactly that case).
        drr_reset_when_idle: a tenant with nothing queued or running has its
            deficit reset to 0 (Shreedhar and Varghese, 1995).
        aging_rate_per_s: tiers gained per second of waiting (policy ``aging``).
        tier_floors: for ``floors``, the guaranteed share of each tier, as a
            tuple indexed by tier (sums to at most 1).
        strict_tiers: tiers as strict lanes under any policy: the policy picks
            among the backlogged tenants of the best (lowest-numbered) tier
            that can go in this step, and a lower tier only when none of them
            can (the gateway lab's interactive and batch lanes; SPEC.md 4.3).
            The policy ``priority`` is FCFS with strict tiers.
        guard_steps, guard_wait_s: the starvation guard (SPEC.md 4.3).  A ready
            queue head is *overdue* once it has waited ``guard_steps`` steps
            since it became ready, or (never scheduled) ``guard_wait_s``
            seconds since its arrival.  While an overdue head, within its own
            tenant's caps, does not fit in the free blocks at the start of the
            waiting phase, the step admits nothing (it stops filling and
            reserves the pool for it).  None (both): no guard.
        guard_skips: the skip budget K_skip (SPEC.md 4.3; policies ``vtc``,
            ``vtc_predict``, ``floors``, ``drr_tokens`` and ``drr_block_seconds``):
            a backlogged tenant (``floors``: a tier) that is not a candidate of a
            pick (its head refused by the pool, or none ready) while its counter
            is below the picked one's (DRR: a refill that carries it above one
            round, the step's reservations counted) is *passed over*; its count of such picks
            (``TenantState.skips``, ``State.tier_skips``) lasts its backlog period,
            across its heads, and once it is K_skip the waiting phase stops
            filling rather than pass it over again.  None: no budget.
    """

    policy: str = attrs.field(default="vtc", validator=_one_of(ORDER_POLICIES))
    w_in: float = attrs.field(default=1.0, validator=_positive)
    w_out: float = attrs.field(default=2.0, validator=_positive)
    lift: bool = attrs.field(default=True, validator=_flag)
    drr_quantum: float = attrs.field(default=2048.0, validator=_positive)
    drr_carry_bound: float | None = attrs.field(default=4096.0, validator=_non_negative)
    drr_reset_when_idle: bool = attrs.field(default=True, validator=_flag)
    aging_rate_per_s: float = attrs.field(default=1.0, validator=_positive)
    tier_floors: tuple[float, ...] = attrs.field(default=(0.8, 0.2), converter=tuple)
    strict_tiers: bool = attrs.field(default=False, validator=_flag)
    guard_steps: int | None = attrs.field(default=None, validator=_positive_int)
    guard_wait_s: float | None = attrs.field(default=None, validator=_positive)
    guard_skips: int | None = attrs.field(default=None, validator=_non_negative_int)

    @guard_skips.validator
    def _check_skips(self, attribute: attrs.Attribute, value: int | None) -> None:
        if value is not None and self.policy not in SKIP_POLICIES:
            raise ConfigError("guard_skips", value, f"the skip budget counts picks past a lower counter; it needs "
                              f"policy {' or '.join(SKIP_POLICIES)}, not {self.policy}")

    @tier_floors.validator
    def _check_floors(self, attribute: attrs.Attribute, value: tuple) -> None:
        if not value or any(not isinstance(f, (int, float)) or f <= 0 for f in value):
            raise ConfigError("tier_floors", value, "each tier's floor must be a positive share")
        if sum(value) > 1.0 + 1e-9:
            raise ConfigError("tier_floors", value, "floors must sum to at most 1")


@attrs.frozen
class AdmissionConfig:
    """Admission control: which arrivals enter a queue (SPEC.md 4.2).

    Per-tenant limits (queue bound, KV cap, buckets) live on :class:`TenantConfig`;
    these switches say which of them are enforced.

    Attributes:
        token_bucket: enforce each tenant's token bucket (prompt tokens at
            admission, generated tokens as produced).
        request_rate_limit: enforce each tenant's request-rate limit.
        queue_bound: enforce each tenant's queue bound.
        kv_cap: enforce each tenant's KV block cap (in scheduling, and reject
            at admission a request that could never fit under it).
        prompt_estimate: ``tokens`` charges the true prompt length at admission;
            ``bytes`` charges ceil(prompt_bytes / bytes_per_token) and reconciles
            to the true length when the prompt is first scheduled.
        bytes_per_token: the byte-length estimate's divisor (bytes per token).
        kv_watermarks: fraction of the pool in use above which a tier's arrivals
            are refused with ``kv_watermark``, as a tuple indexed by tier; empty
            disables.  Tiers past the end use the last value.
        kv_watermark_queued: the watermark also counts queued work, as the
            gateway lab of the seed documents does: a tier-t arrival is refused
            when blocks in use + the blocks (``blocks_for(prompt + output)``)
            of every never-scheduled request queued by tenants of tiers 0..t +
            its own blocks exceed the watermark x ``num_blocks`` (SPEC.md 4.2).
        wait_limits_s: estimated-wait shedding: most estimated queue wait
            (seconds) of a tier's arrivals, as a tuple indexed by tier (past
            the end: the last value); empty disables.  The estimate of a
            tier-t arrival is the service tokens (``order.w_in`` x prompt +
            ``order.w_out`` x output, the request's max tokens) of every
            never-scheduled request queued by tier-t tenants, divided by
            ``wait_service_rate_tokens_per_s``; over the limit, the arrival is
            refused ``estimated_wait`` with retry-after = estimate - limit.
        wait_service_rate_tokens_per_s: the service rate (service tokens per
            second) the estimate divides by; needed with ``wait_limits_s``.
        slot_cap: enforce each tenant's ``max_running_seqs`` and the tier caps
            below (in scheduling: a head over a cap is skipped, SPEC.md 4.3).
        tier_slot_caps: most sequences of a tier's tenants in the batch at
            once, as a tuple indexed by tier (sequences); empty disables.
            Tiers past the end use the last value.
        reserve_output: the token bucket charges a request's prompt plus its
            whole output allowance (``output_tokens``, the request's max tokens)
            at admission, and gives back the part not generated when the
            request is cancelled or rejected after admission; generated tokens
            are then not charged again (SPEC.md 4.2).  Needs ``token_bucket``.
    """

    token_bucket: bool = attrs.field(default=False, validator=_flag)
    request_rate_limit: bool = attrs.field(default=False, validator=_flag)
    queue_bound: bool = attrs.field(default=True, validator=_flag)
    kv_cap: bool = attrs.field(default=True, validator=_flag)
    prompt_estimate: str = attrs.field(default="tokens", validator=_one_of(PROMPT_ESTIMATES))
    bytes_per_token: float = attrs.field(default=4.0, validator=_positive)
    kv_watermarks: tuple[float, ...] = attrs.field(default=(), converter=tuple)
    slot_cap: bool = attrs.field(default=True, validator=_flag)
    tier_slot_caps: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    reserve_output: bool = attrs.field(default=False, validator=_flag)
    kv_watermark_queued: bool = attrs.field(default=False, validator=_flag)
    wait_limits_s: tuple[float, ...] = attrs.field(default=(), converter=tuple)
    wait_service_rate_tokens_per_s: float | None = attrs.field(default=None, validator=_positive)

    @tier_slot_caps.validator
    def _check_tier_slot_caps(self, attribute: attrs.Attribute, value: tuple) -> None:
        for c in value:
            if isinstance(c, bool) or not isinstance(c, int) or c <= 0:
                raise ConfigError("tier_slot_caps", value, "each tier's slot cap must be a positive integer")

    def __attrs_post_init__(self) -> None:
        if self.reserve_output and not self.token_bucket:
            raise ConfigError("reserve_output", True, "reserving output needs token_bucket = true")
        if self.wait_limits_s and self.wait_service_rate_tokens_per_s is None:
            raise ConfigError("wait_service_rate_tokens_per_s", None,
                              "estimated-wait shedding (wait_limits_s) needs the service rate it divides by")
        if self.kv_watermark_queued and not self.kv_watermarks:
            raise ConfigError("kv_watermark_queued", True, "counting queued blocks needs kv_watermarks")

    @wait_limits_s.validator
    def _check_wait_limits(self, attribute: attrs.Attribute, value: tuple) -> None:
        for w in value:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0:
                raise ConfigError("wait_limits_s", value, "each tier's wait limit must be a positive number of seconds")

    @kv_watermarks.validator
    def _check_watermarks(self, attribute: attrs.Attribute, value: tuple) -> None:
        for w in value:
            if not isinstance(w, (int, float)) or not 0 < w <= 1:
                raise ConfigError("kv_watermarks", value, "each watermark must be a fraction in (0, 1]")


@attrs.frozen
class EvictionConfig:
    """Preemption by recompute and its hysteresis (SPEC.md 4.5).

    Attributes:
        victim: one of :data:`VICTIM_POLICIES`.
        min_free_blocks: an eviction happens only if the victims chosen for one
            allocation free at least this many blocks (unless they are every
            running sequence).
        cooldown_steps: a preempted sequence is not readmitted for this many steps.
        max_evictions: a sequence that has been evicted this many times and is
            chosen again is rejected with ``evicted_too_often``.  None: unbounded.
        preempt_for_priority: a waiting queue head may preempt running
            sequences of a lower tier (a larger tier number) when it lacks a
            batch slot or blocks (policy ``priority`` only; SPEC.md 4.5).  Within
            the hysteresis: each victim frees at least ``min_free_blocks``, a
            victim already evicted ``max_evictions`` times is never taken, and a
            victim waits ``cooldown_steps`` like any evicted sequence.
    """

    victim: str = attrs.field(default="newest", validator=_one_of(VICTIM_POLICIES))
    min_free_blocks: int = attrs.field(default=0, validator=_non_negative_int)
    cooldown_steps: int = attrs.field(default=0, validator=_non_negative_int)
    max_evictions: int | None = attrs.field(default=None, validator=_non_negative_int)
    preempt_for_priority: bool = attrs.field(default=False, validator=_flag)


@attrs.frozen
class CostConfig:
    """Step-time cost model (SPEC.md 4.7).

    ``unit`` mode: every step lasts ``unit_step_s``.  ``roofline`` mode:
    step_s = max(weight_read_s + kv_tokens * kv_read_s_per_token,
                 batched_tokens * flop_s_per_token) + overhead_s,
    the roofline of Williams et al. (CACM 2009) applied per step: memory time
    (weights once per step plus every context token's KV) against compute time
    (2 * parameters FLOPs per token).  Defaults: a 70B model in 16-bit on 8
    H100s (3.35 TB/s and about 600 TFLOP/s usable each).

    Attributes:
        mode: ``roofline`` or ``unit``.
        unit_step_s: step length in unit mode (seconds).
        weight_read_s: time to read the weights once (seconds).
        kv_read_s_per_token: time to read one token's KV (seconds/token).
        flop_s_per_token: compute time per batched token (seconds/token).
        overhead_s: fixed host overhead per step (seconds).
    """

    mode: str = attrs.field(default="roofline", validator=_one_of(COST_MODES))
    unit_step_s: float = attrs.field(default=1.0, validator=_positive)
    weight_read_s: float = attrs.field(default=141e9 / 8 / 3.35e12, validator=_non_negative)
    kv_read_s_per_token: float = attrs.field(default=2 * 80 * 8 * 128 * 2 / 8 / 3.35e12, validator=_non_negative)
    flop_s_per_token: float = attrs.field(default=2 * 70.6e9 / 8 / 600e12, validator=_non_negative)
    overhead_s: float = attrs.field(default=0.0008, validator=_non_negative)

    @property
    def empty_step_s(self) -> float:
        """Duration of a step with nothing in the batch (seconds): ``unit_step_s``
        in unit mode, else ``overhead_s`` (``weight_read_s`` when there is no
        overhead).  Also the previous-step duration of the initial state."""
        if self.mode == "unit":
            return self.unit_step_s
        return self.overhead_s if self.overhead_s > 0 else self.weight_read_s


@attrs.frozen
class Config:
    """A whole replica: tenants, batch limits, the KV pool and every policy.

    Attributes:
        tenants: the tenants, in a fixed order (their index is their id in the state).
        block_size_tokens: tokens per KV block (16).
        num_blocks: KV blocks in the pool.
        max_num_seqs: most sequences running at once.
        token_budget: most tokens (prefill chunks plus decode tokens) per step.
        max_context_tokens: longest prompt plus output accepted; longer is
            rejected at admission with ``too_long``.
        order, admission, eviction, cost: the policies.
        prefix_cache: ``off``, ``shared`` or ``salted``.

    Raises:
        ConfigError: on any invalid field, naming it and its value.
    """

    tenants: tuple[TenantConfig, ...] = attrs.field(converter=tuple)
    block_size_tokens: int = attrs.field(default=16, validator=_positive_int)
    num_blocks: int = attrs.field(default=81_250, validator=_positive_int)
    max_num_seqs: int = attrs.field(default=256, validator=_positive_int)
    token_budget: int = attrs.field(default=512, validator=_positive_int)
    max_context_tokens: int = attrs.field(default=131_072, validator=_positive_int)
    order: OrderConfig = attrs.field(factory=OrderConfig)
    admission: AdmissionConfig = attrs.field(factory=AdmissionConfig)
    eviction: EvictionConfig = attrs.field(factory=EvictionConfig)
    cost: CostConfig = attrs.field(factory=CostConfig)
    prefix_cache: str = attrs.field(default="off", validator=_one_of(PREFIX_CACHE_MODES))
    _by_name: dict = attrs.field(init=False, eq=False, repr=False, hash=False)

    @tenants.validator
    def _check_tenants(self, attribute: attrs.Attribute, value: tuple) -> None:
        if not value:
            raise ConfigError("tenants", value, "at least one tenant is required")
        seen: set[str] = set()
        for t in value:
            if not isinstance(t, TenantConfig):
                raise ConfigError("tenants", t, "each tenant must be a TenantConfig")
            if t.name in seen:
                raise ConfigError("tenants", t.name, "duplicate tenant name")
            seen.add(t.name)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {t.name: i for i, t in enumerate(self.tenants)})
        if self.order.policy == "floors":
            top = max(t.tier for t in self.tenants)
            if top >= len(self.order.tier_floors):
                raise ConfigError(
                    "order.tier_floors", self.order.tier_floors,
                    f"policy floors needs a floor for every tier 0..{top}",
                )
        if self.eviction.preempt_for_priority and self.order.policy != "priority":
            raise ConfigError(
                "eviction.preempt_for_priority", True,
                f"preemption for priority needs order policy priority, not {self.order.policy}",
            )
        if self.order.drr_carry_bound is not None and self.order.drr_carry_bound < self.order.drr_quantum:
            raise ConfigError(
                "order.drr_carry_bound", self.order.drr_carry_bound,
                f"must be at least drr_quantum ({self.order.drr_quantum}) or None",
            )

    def tenant_index(self, name: str) -> int:
        """Index of the tenant called ``name``.

        Raises:
            ConfigError: if no tenant has that name.
        """
        idx = self._by_name.get(name)
        if idx is None:
            raise ConfigError("tenant", name, f"unknown tenant; configured: {', '.join(self._by_name)}")
        return idx

    def blocks_for(self, num_tokens: int) -> int:
        """KV blocks needed to hold ``num_tokens`` tokens: ceil(tokens / block_size_tokens)."""
        return -(-num_tokens // self.block_size_tokens)


def config_to_dict(config: Config) -> dict[str, Any]:
    """The configuration as plain JSON-able data (for history headers)."""
    return attrs.asdict(config, filter=lambda a, v: not a.name.startswith("_"))
