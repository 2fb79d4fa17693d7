"""Shared pieces of the invariant catalog: findings, the invariant record, and
the bounds derived from a configuration (SPEC.md section 7).

A :class:`Finding` is data first (Elle's anomaly maps): which invariant, at
which step, which tenants and requests, the number observed and the number
allowed; ``str(finding)`` renders it as one sentence.  An :class:`Invariant`
is a small record of functions (Porcupine's model record): ``applies(config)``,
and a state form, a history form and/or a two-run form.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Callable, Iterable

import attrs

from tenantry.model.config import Config
from tenantry.model.policies import step_s_max

#: Absolute slack for float comparisons of accumulated counters (weighted tokens,
#: seconds).  Counters are sums of at most a few million products of floats, so
#: their rounding error is far below this.
EPS = 1e-6


@attrs.frozen
class Finding:
    """One broken invariant (or broken protocol rule), as data.

    The one finding record of tenantry: the catalog's checks over model
    states, step records and histories, the harness that drives a scheduler
    under test, and every report (``matrix.json`` included) carry it as is.

    Attributes:
        invariant: the invariant id (``KV-CONSERVE``, ``VTC-GAP``, ...) or a
            protocol id of the harness (:data:`tenantry.verify.protocol.PROTOCOL`).
        step: step index where it shows; None for a whole-run property.
        tenants: tenant names involved (possibly empty).
        requests: request ids involved (possibly empty).
        observed: the observed value (a number where there is one).
        allowed: the bound or the expected value.
        message: one line saying what broke, in the invariant's words.
        call: the call into a scheduler under test that produced it
            (``plan_step``, ``add_request``, ...), or None.
        count: how many findings with the same invariant, tenants and
            requests this one stands for (:func:`dedup`); its step is the first.
    """

    invariant: str
    step: int | None
    tenants: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    requests: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    observed: Any = None
    allowed: Any = None
    message: str = ""
    call: str | None = None
    count: int = 1

    @property
    def tenant(self) -> str | None:
        """The first tenant involved, or None."""
        return self.tenants[0] if self.tenants else None

    @property
    def request_id(self) -> int | None:
        """The first request involved, or None."""
        return self.requests[0] if self.requests else None

    def render(self) -> str:
        """One line: ``ID step k tenant t request r [call c]: message (observed x, allowed y)``."""
        parts = [self.invariant, "whole run" if self.step is None else f"step {self.step}"]
        if self.tenants:
            parts.append(("tenant " if len(self.tenants) == 1 else "tenants ") + ", ".join(self.tenants))
        if self.requests:
            shown = ", ".join(str(r) for r in self.requests[:6]) + (", ..." if len(self.requests) > 6 else "")
            parts.append(("request " if len(self.requests) == 1 else "requests ") + shown)
        if self.call is not None:
            parts.append(f"call {self.call}")
        line = " ".join(parts) + ": " + self.message
        if self.observed is not None or self.allowed is not None:
            line += f" (observed {_fmt(self.observed)}, allowed {_fmt(self.allowed)})"
        if self.count > 1:
            line += f" [{self.count} times from this step on]"
        return line

    __str__ = render

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able form (values that are not JSON become lists or their repr)."""
        d = attrs.asdict(self, recurse=False)
        d["tenants"], d["requests"] = list(self.tenants), list(self.requests)
        for k in ("observed", "allowed"):
            d[k] = _jsonable(d[k])
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Finding":
        """The inverse of :meth:`to_json` (observed/allowed stay as JSON gave them)."""
        names = {a.name for a in attrs.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and v != v:
        return "nan"
    if isinstance(v, (int, float, str, bool, type(None))):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return repr(v)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def dedup(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per (invariant, tenants, requests): the first, with ``count`` the number folded in.

    Order is that of first appearance, so a run's report shows each fault once
    with the step where it first showed (the issue's "one line per invariant
    and request or tenant with a count and the first step").
    """
    first: dict[tuple, Finding] = {}
    counts: dict[tuple, int] = {}
    for f in findings:
        key = (f.invariant, f.tenants, f.requests)
        if key in first:
            counts[key] += f.count
        else:
            first[key], counts[key] = f, f.count
    return [attrs.evolve(f, count=counts[k]) if counts[k] != f.count else f for k, f in first.items()]


#: The finding id of a check that raised instead of judging (SPEC.md 7): the
#: invariant was not judged on that run.  Never a scheduler's fault: a bug in
#: tenantry, or records the check does not expect; reported so that one check
#: cannot end a whole run without a report.
CHECK_RAISED = "CHECK-RAISED"


def check_raised(invariant_id: str, error: Exception, step: int | None = None) -> Finding:
    """The :data:`CHECK_RAISED` finding for ``invariant_id``'s check that raised ``error``
    (at ``step``, for a state form; None for a history or two-run form)."""
    text = str(error).splitlines()[0][:200] if str(error) else ""
    return Finding(CHECK_RAISED, step, (), (), type(error).__name__, None,
                   f"the {invariant_id} check raised {type(error).__name__}{': ' + text if text else ''}, so "
                   f"{invariant_id} was not judged on this run (a tenantry bug: please report it with this workload)")


#: What a history form may need (SPEC.md 6): step records; per-request blocks
#: (``held``: or no shareable block); block ids; the scheduler's counters /
#: deficits; ``books``: the order policy's own (VTC counters, DRR deficits).
NEEDS = ("steps", "held", "block_ids", "counters", "deficits", "books")

StateCheck = Callable[..., list[Finding]]
HistoryCheck = Callable[..., list[Finding]]
PairCheck = Callable[..., list[Finding]]


@attrs.frozen
class Invariant:
    """A named invariant with a stable id.

    Attributes:
        id: stable id (SPEC.md 7 uses it as the paragraph name).
        summary: one line: what must hold.
        spec: the SPEC.md paragraph, e.g. ``7.2``.
        source: paper and theorem the bound comes from, or "" when none.
        applies: ``applies(config) -> bool``: the configurations it is claimed for.
        check_state: ``check_state(ctx) -> list[Finding]`` over one step's
            :class:`~tenantry.spec.invariants_state.StepContext`, or None.
        check_history: ``check_history(hctx) -> list[Finding]`` over a recorded
            history's :class:`~tenantry.spec.invariants_history.HistoryContext`, or None.
        check_pair: ``check_pair(history_a, history_b, **kw) -> list[Finding]``
            for two-run properties (DETERMINISM, NONINTERFERENCE), or None.
        always: a safety invariant every scheduler must keep (checked on any
            history); False: a claim, checked on a scheduler's history only
            when it claims it (``Claims.invariants``, or implied by its config).
        needs: what the history form needs beyond request records, from
            :data:`NEEDS`; a history without it leaves the invariant unchecked,
            and the report says so.
        derived: the state form is the record form's judgement of one step, run
            on a step of the model (one definition:
            :func:`~tenantry.spec.invariants_state.from_record`).
        state_only: why the state form is not (only) that: what it judges that
            the records do not carry ("" when nothing).  With ``derived``, the
            state-only part beside the derived form; without it, why the state
            form is a definition of its own (or the only form).
    """

    id: str
    summary: str
    spec: str
    applies: Callable[[Config], bool]
    source: str = ""
    check_state: StateCheck | None = None
    check_history: HistoryCheck | None = None
    check_pair: PairCheck | None = None
    always: bool = False
    needs: tuple[str, ...] = ()
    derived: bool = False
    state_only: str = ""

    @property
    def forms(self) -> tuple[str, ...]:
        """Which forms exist: a subset of ("state", "history", "pair")."""
        return tuple(n for n, f in (("state", self.check_state), ("history", self.check_history),
                                    ("pair", self.check_pair)) if f is not None)

    @property
    def state_kind(self) -> str | None:
        """What the state form is, in the words of SPEC.md 7's table of state forms:
        ``derived from the record form``, ``derived, plus a state-only part``, ``its own
        (two forms)`` or ``its own (no record form)``; None without a state form."""
        if self.check_state is None:
            return None
        if self.derived:
            return "derived, plus a state-only part" if self.state_only else "derived from the record form"
        return "its own (two forms)" if self.check_history is not None else "its own (no record form)"


# --- applicability predicates -------------------------------------------------------


def caps_enforced(config: Config) -> bool:
    """Some tenant has a KV block cap and the admission config enforces caps."""
    return config.admission.kv_cap and any(t.kv_block_cap is not None for t in config.tenants)


def slot_caps(config: Config, tenant: str) -> tuple[int | None, int | None]:
    """The enforced batch-slot caps over tenant ``tenant`` (sequences): its own
    ``max_running_seqs`` and its tier's ``tier_slot_caps`` entry, each None when
    not enforced (SPEC.md 4.3; tiers past the end of the tuple use the last)."""
    adm = config.admission
    tc = next((t for t in config.tenants if t.name == tenant), None)
    if not adm.slot_cap or tc is None:
        return None, None
    tier_cap = adm.tier_slot_caps[min(tc.tier, len(adm.tier_slot_caps) - 1)] if adm.tier_slot_caps else None
    return tc.max_running_seqs, tier_cap


def slot_caps_enforced(config: Config) -> bool:
    """Some batch-slot cap (per tenant or per tier) is enforced."""
    adm = config.admission
    return adm.slot_cap and (bool(adm.tier_slot_caps) or any(t.max_running_seqs is not None for t in config.tenants))


def hopeless(config: Config, prompt_tokens: int, output_tokens: int) -> bool:
    """A request can never finish on ``config``'s pool: the KV it needs before its last
    token (``prompt + output - 1`` tokens; the last token needs none) exceeds the whole
    pool (``num_blocks * block_size_tokens``), so no schedule produces its last token."""
    return prompt_tokens + output_tokens - 1 > config.num_blocks * config.block_size_tokens


def at_slot_cap(config: Config, tenant: str, in_batch: Iterable[str]) -> bool:
    """Tenant ``tenant`` may not put one more sequence in the batch: with ``in_batch``
    the tenants of the sequences in the batch (one name per sequence), its own or
    its tier's slot cap is reached."""
    own, tier_cap = slot_caps(config, tenant)
    if own is None and tier_cap is None:
        return False
    names = list(in_batch)
    if own is not None and sum(1 for n in names if n == tenant) >= own:
        return True
    if tier_cap is not None:
        tier = {t.name: t.tier for t in config.tenants}
        mine = tier[tenant]
        if sum(1 for n in names if tier.get(n) == mine) >= tier_cap:
            return True
    return False


def ample_kv(config: Config) -> bool:
    """The KV pool can never bind: every admitted request fits whatever else runs.

    True when no tenant KV cap is enforced and ``num_blocks >= max_num_seqs *
    blocks_for(max_context_tokens)``: then no allocation is ever short, no
    sequence is preempted, and no queue head is skipped for lack of blocks, so
    the scheduling order is exactly the policy's (SPEC.md 7, "ample KV").
    An enforced batch-slot cap skips heads as a KV cap does, and preemption for
    priority evicts with blocks to spare, so either makes it False; so do strict
    tiers (``order.strict_tiers``) over tenants of more than one tier, under which
    a lower tier waits while a higher one has work whatever the counters say.
    """
    if caps_enforced(config) or slot_caps_enforced(config) or config.eviction.preempt_for_priority:
        return False
    if config.order.strict_tiers and len({t.tier for t in config.tenants}) > 1:
        return False
    return config.num_blocks >= config.max_num_seqs * config.blocks_for(config.max_context_tokens)


def batch_token_capacity(config: Config, max_total_tokens: int | None = None) -> int:
    """M: the most tokens (prompt plus output) the sequences of one batch can reach.

    ``min(num_blocks * block_size_tokens, max_num_seqs * T)`` with T the
    longest request (prompt + output, tokens): ``max_total_tokens`` when the
    workload is known, else ``max_context_tokens``.  Under the skip budget
    (``order.guard_skips``, claimed without ample KV) the pool term is dropped,
    ``max_num_seqs * T``: under KV pressure the sequences of a tenant in the
    batch may still owe more output than the pool holds (they are preempted and
    resumed), so only the slots bound it (SPEC.md 7.0).  With ample KV the pool
    term never binds, so the two agree there.
    """
    t = config.max_context_tokens if max_total_tokens is None else min(max_total_tokens, config.max_context_tokens)
    if config.order.guard_skips is not None:
        return config.max_num_seqs * t
    return min(config.num_blocks * config.block_size_tokens, config.max_num_seqs * t)


def largest_charge(config: Config, max_prompt_tokens: int | None = None, max_total_tokens: int | None = None) -> float:
    """D: the most weighted tokens a tenant can be charged after its last pick.

    Derived in SPEC.md 7.7 from the model's charging rule (prompt w_in * P at
    the pick, w_out per output token of every sequence of the tenant still in
    the batch): D = min(w_in * L + w_out * M, max(w_in, w_out) * M), where L is
    the longest prompt and M :func:`batch_token_capacity`.  With w_in <= w_out
    this is w_out * M = max(w_in * L, w_out * M), the constant of Sheng et al.,
    OSDI 2024, Theorem 4.4.
    """
    o = config.order
    m = batch_token_capacity(config, max_total_tokens)
    lp = (config.max_context_tokens - 1) if max_prompt_tokens is None else max_prompt_tokens
    lp = min(lp, m)
    return min(o.w_in * lp + o.w_out * m, max(o.w_in, o.w_out) * m)


def largest_block_seconds(config: Config) -> float:
    """D_bs: the most KV block-seconds a tenant can be charged after its last pick
    under ``drr_block_seconds`` in ``unit`` cost mode (SPEC.md 8.4, H2 for block-seconds).

    ``min(num_blocks, max_num_seqs * blocks_for(max_context_tokens)) * H *
    unit_step_s`` with ``H = max_context_tokens + floor((max_num_seqs - 1) *
    max_context_tokens / token_budget)`` steps.  Derivation: after the pick the
    tenant's running sequences hold at most that many blocks in any step (the pool,
    and at most max_num_seqs sequences of at most blocks_for(max_context_tokens)
    blocks), and each holds blocks for at most H more steps: in each step the
    running phase gives it at least one of its at most ``max_context_tokens``
    remaining tokens, or evicts it (it then holds nothing), or leaves it out
    because the sequences ahead of it in batch order (older, at most
    ``max_num_seqs - 1`` of them, with at most ``max_context_tokens`` tokens each
    still to compute; later admissions join behind it) took the whole token
    budget.  Every step lasts ``unit_step_s`` in ``unit`` mode, the step-duration
    bound this constant needs; outside it, returns the same form with
    :func:`step_s_max`'s roofline (the proof does not claim it there, H4)."""
    m, ctx = config.max_num_seqs, config.max_context_tokens
    blocks = min(config.num_blocks, m * config.blocks_for(ctx))
    steps = ctx + (m - 1) * ctx // config.token_budget
    return blocks * steps * step_s_max(config)


def drr_charge_bound(config: Config) -> float:
    """D in the DRR unit: :func:`largest_charge` (weighted tokens) under ``drr_tokens``,
    :func:`largest_block_seconds` under ``drr_block_seconds``."""
    return largest_block_seconds(config) if config.order.policy == "drr_block_seconds" else largest_charge(config)


def skip_budget_claimed(config: Config) -> bool:
    """VTC-GAP, FLOOR and DRR-DEFICIT's tight bounds are claimed under KV pressure
    (SPEC.md 7.0, 8.3-8.5): a skip budget is set (``order.guard_skips``), no tenant
    KV cap or slot cap is enforced (a head its own cap refuses is not counted: the
    cap limits the tenant on purpose), no strict tiers over more than one tier (a
    lower tier waits its turn uncounted), and under DRR a carry bound of at least
    ``q w_max`` times :func:`drr_skip_rounds` (``drr_block_seconds``: plus D_bs, the
    step's reservations, and ``unit`` cost mode, H4 of SPEC.md 8.4), or none."""
    o = config.order
    if o.guard_skips is None or caps_enforced(config) or slot_caps_enforced(config):
        return False
    if o.policy in ("drr_tokens", "drr_block_seconds"):  # no cut of a refill past a blocked tenant (SPEC.md 8.4)
        d = drr_charge_bound(config)
        need = o.drr_quantum * max(t.weight for t in config.tenants) * drr_skip_rounds(config, d)
        if o.policy == "drr_block_seconds":
            if config.cost.mode != "unit":
                return False
            need += d
        if o.drr_carry_bound is not None and o.drr_carry_bound < need:
            return False
    return not (o.strict_tiers and len({t.tier for t in config.tenants}) > 1)


def drr_skip_rounds(config: Config, d: float) -> float:
    """DRR under the skip budget (SPEC.md 8.4): the most rounds a deficit may stand above
    zero, ``1 + guard_skips * (D / (q w_min) + 1)``: one round, plus at most
    ``D / (q w_min) + 1`` rounds per refill past the tenant (a refill gives at most
    that many rounds, since no candidate's deficit is below -D).  1 without a budget."""
    o = config.order
    k = o.guard_skips or 0
    return 1 + k * (d / (o.drr_quantum * min(t.weight for t in config.tenants)) + 1)


def skip_slack(config: Config, d: float) -> float:
    """What the skip budget adds to VTC-GAP's per-tenant bound (SPEC.md 7.0, 8.3):
    ``guard_skips * D / w_min`` (weighted tokens over weight; ``d`` is D, w_min the
    least tenant weight): each pick past a tenant charges the picked tenant at most
    D / w <= D / w_min ahead of it.  Under ``floors`` the same over tiers (FLOOR,
    8.5): ``guard_skips * D / f_min``, f_min the least floor of a tier in use.  0
    without a skip budget."""
    k = config.order.guard_skips
    if k is None:
        return 0.0
    if config.order.policy == "floors":
        return k * d / min(tier_share(config, t.tier) for t in config.tenants)
    if config.order.policy in ("drr_tokens", "drr_block_seconds"):  # per side of DRR-GAP: K (D / w_min + q) (8.4)
        return k * (d / min(t.weight for t in config.tenants) + config.order.drr_quantum)
    return k * d / min(t.weight for t in config.tenants)


def tier_share(config: Config, tier: int) -> float:
    """The floor share of ``tier`` under policy ``floors`` (last floor for tiers past the end)."""
    f = config.order.tier_floors
    return f[min(tier, len(f) - 1)]


def owed(cfg: Any, running: Iterable[Any], n: int) -> list[Fraction]:
    """The VTC encodings' ghost G per tenant 0..n-1 (SPEC.md 8.3): what the running sequences
    still owe their tenant's counter, ``w_out / weight`` per output token not yet generated
    (``cfg`` a :class:`~tenantry.model.config.Config`, ``running`` its sequences; exact)."""
    g = [Fraction(0)] * n
    for s in running:
        g[s.tenant] += Fraction(cfg.order.w_out) * (s.request.output_tokens - s.output_done) / \
            Fraction(cfg.tenants[s.tenant].weight)
    return g
