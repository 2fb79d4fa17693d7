"""The invariant catalog: one registry of named checks by stable id (SPEC.md section 7).

Public surface::

    INVARIANTS: dict[str, Invariant]      # id -> record (see invariants_core.Invariant)
    check_state(config, prev, state, output, inputs=StepInput(), ids=None) -> list[Finding]
    check_history(history, claims=None, ids=None) -> list[Finding]
    check_pair(invariant_id, history_a, history_b, **kw) -> list[Finding]
    unknown_without_steps(history, claims=None) -> list[str]   # ids a step-less history cannot judge
    relabel_contents(workload, tenant, offset) -> Workload   # NONINTERFERENCE's second run

Each check applies only where ``INVARIANTS[id].applies(config)`` holds; the
functions above skip the others.  ``claims`` for a history is the
:class:`~tenantry.model.config.Config` the scheduler claims to run, or an
object with a ``config`` attribute (and optionally ``claimed() -> set of
ids``, as :class:`tenantry.verify.protocol.Claims`), or None to read the
configuration from the history's header.
"""

from __future__ import annotations

from typing import Any, Iterable

import attrs

from tenantry.model.config import (
    AdmissionConfig, Config, ConfigError, CostConfig, EvictionConfig, OrderConfig, TenantConfig,
)
from tenantry.model.state import State
from tenantry.model.step import StepOutput
from tenantry.model.workload import Request, StepInput, Workload
from tenantry.runner.history import History, StepRecord, history_lines
from tenantry.runner.setups import config_from_dict

from . import invariants_claims as C
from . import invariants_history as H
from . import invariants_history_blocks as HB
from . import invariants_history_evict as HE
from . import invariants_history_fair as HF
from . import invariants_live as L
from . import invariants_policy as P
from . import invariants_state as S
from .invariants_core import (
    CHECK_RAISED, Finding, Invariant, ample_kv, caps_enforced, check_raised, skip_budget_claimed, slot_caps_enforced,
)

__all__ = ["CHECK_RAISED", "INVARIANTS", "CLAIMABLE", "HISTORY_NEEDS_STEPS", "Finding", "Invariant", "check_state", "check_history",
           "check_pair", "config_from_dict", "coverage", "missing", "relabel_contents", "unknown_without_steps"]

_VTC_SRC = "Sheng et al., Fairness in Serving Large Language Models, OSDI 2024, Algorithm 2 and Theorem 4.4"
_DRR_SRC = "Shreedhar and Varghese, Efficient Fair Queueing Using Deficit Round Robin, SIGCOMM 1995, Lemma 2"


def _always(config: Config) -> bool:
    return True


def _pair_determinism(a: History, b: History, **_: Any) -> list[Finding]:
    """DETERMINISM (SPEC.md 7.6): two runs of one configuration and workload
    serialise to the same bytes; the finding names the first line that differs.

    Equal ``repr``s (every value with its type: 1, 1.0 and True, 0.0 and -0.0 differ) serialise
    to the same bytes, and cost a third of serialising: the lines are compared only when they differ."""
    if repr(a) == repr(b):
        return []
    la, lb = list(history_lines(a)), list(history_lines(b))
    for n, (x, y) in enumerate(zip(la, lb)):
        if x != y:
            step = n - 1 if 0 < n <= len(a.steps) else None
            return [Finding("DETERMINISM", step, (), (), x[:80], y[:80],
                            f"the two runs' histories differ first at line {n + 1}")]
    if len(la) != len(lb):
        return [Finding("DETERMINISM", None, (), (), len(la), len(lb), "the two runs' histories differ in length")]
    return []


def _pair_noninterference(a: History, b: History, *, observer: str, **_: Any) -> list[Finding]:
    """NONINTERFERENCE (SPEC.md 7.5): tenant ``observer``'s request records are
    identical in two runs whose workloads differ only in another tenant's
    prompt contents."""
    ra = [r for r in a.requests if r.tenant == observer]
    rb = [r for r in b.requests if r.tenant == observer]
    for x, y in zip(ra, rb):
        if x != y:
            diff = next(f.name for f in attrs.fields(type(x)) if getattr(x, f.name) != getattr(y, f.name))
            return [Finding("NONINTERFERENCE", None, (observer,), (x.request_id,), getattr(x, diff),
                            getattr(y, diff), f"{observer}'s {diff} changed when only another tenant's prompt "
                            "contents changed")]
    if len(ra) != len(rb):
        return [Finding("NONINTERFERENCE", None, (observer,), (), len(ra), len(rb),
                        "the observer's request count differs between the runs")]
    return []


def _inv(id, summary, spec, applies, source="", state=None, history=None, pair=None, always=False,
         needs=(), step=None, state_part=None, why="", anomalies=False) -> Invariant:
    """One catalog entry.  ``step``: the record form's judgement of one step, from which the
    state form derives (:func:`~tenantry.spec.invariants_state.from_record`; ``anomalies``:
    with the records' walk's anomalies), plus ``state_part`` when given; ``state``: a state
    form of its own instead; ``why``: what the state form judges that no record carries."""
    derived = step is not None
    if derived:
        state = S.from_record(id, step, anomalies)
        if state_part is not None:
            state = S.with_state_part(id, state, state_part)
    return Invariant(id=id, summary=summary, spec=spec, applies=applies, source=source, check_state=state,
                     check_history=history, check_pair=pair, always=always, needs=tuple(needs), derived=derived,
                     state_only=why)


_pol = lambda *names: (lambda c: c.order.policy in names)
_STEPS, _HELD = ("steps",), ("steps", "held")

#: Why a history cannot judge the starvation guard's and priority preemption's reasoning.
_GUARD_WHY = ("it judges what the step's waiting phase saw: each overdue head against the free blocks at the "
              "phase's start, and the skip budget's counts (per tenant, per tier under floors), the model's own "
              "counters that no record carries; a history claims the same promise as BOUNDED-WAIT")
_PREEMPT_WHY = ("what evicting a sequence would free depends on which of its blocks others share (the prefix "
                "cache's reference counts), and completeness on the plan's view of the batch; records carry blocks "
                "per request, not their sharing; a history claims the same promise as BOUNDED-WAIT")

INVARIANTS: dict[str, Invariant] = {i.id: i for i in (
    _inv("KV-CONSERVE", "free + distinct blocks in use = pool; requests hold the blocks of their KV; a block is "
         "shared only as a prefix of one salt's content", "7.1", _always, step=HB.s_kv_conserve, anomalies=True,
         state_part=S.kv_books, history=HB.h_kv_conserve, always=True, needs=_STEPS,
         why="the pool's own books (the prefix cache's reference counts and retained blocks, blocks in use as "
             "private blocks plus distinct cache keys, a tenant's running count, a waiting sequence's KV, and that "
             "a sequence holds no more than its tokens need) are the model's; records carry blocks per request and "
             "in use, and a scheduler may hold blocks ahead of its tokens"),
    _inv("KV-CAP", "blocks in use <= pool; each tenant <= its enforced cap", "7.1",
         _always, step=HB.s_kv_cap, history=HB.h_kv_cap, always=True, needs=_STEPS),
    _inv("SLOT-CAP", "each tenant's (and tier's) sequences in the batch <= its enforced slot cap", "7.1",
         slot_caps_enforced, step=H.s_slot_cap, history=H.h_slot_cap, always=True, needs=_STEPS),
    _inv("QUEUE-BOUND", "never-scheduled queued requests <= bound; overflow refused queue_full at once", "7.1",
         lambda c: c.admission.queue_bound and any(t.queue_bound is not None for t in c.tenants),
         step=H.s_queue_bound, state_part=S.queue_count, history=H.h_queue_bound, always=True, needs=_STEPS,
         why="the queue-bound counter (fresh_queued) is the model's own; records carry the requests it counts"),
    _inv("NO-LOSS", "every request in one place, ending once as finished, rejected (with reason) or cancelled",
         "7.1", _always, step=H.s_no_loss, anomalies=True, state_part=S.arrivals_and_handover, history=H.h_no_loss,
         always=True,
         why="the model answers each arrival in the step it arrives at, refuses at once one that can never finish, "
             "and hands every request that left to the recorder (StepOutput.finished); records show an arrival "
             "only by its answer and a request's end only in its record, so the record form judges those over "
             "the whole run"),
    _inv("BATCH-LIMITS", "sequences <= max_num_seqs, tokens <= token_budget, preempted never in the batch", "7.1",
         _always, step=H.s_batch_limits, anomalies=True, history=H.h_batch_limits, always=True, needs=_STEPS),
    _inv("REFUSAL-TRUTH", "every 429's reason was true when it was given", "7.3", _always,
         history=C.h_refusal_truth, always=True, needs=_STEPS),
    _inv("WORK-CONSERVING", "no unused slot and budget while a ready waiting request surely fits", "7.1",
         _always, step=H.s_work_conserving, history=H.h_work_conserving, needs=_HELD),
    _inv("VTC-GAP", "backlogged tenants' normalised service differs by <= D/w_f + D/w_g", "7.2",
         lambda c: c.order.policy == "vtc" and c.order.lift and (ample_kv(c) or skip_budget_claimed(c)),
         _VTC_SRC, step=HF.s_vtc_gap, history=HF.h_vtc_gap, needs=_STEPS),
    _inv("NO-BANKED-CREDIT", "a newly backlogged tenant starts at >= the least backlogged counter; idle DRR "
         "tenants keep no deficit", "7.2",
         lambda c: (c.order.policy in ("vtc", "floors") and c.order.lift) or (
             c.order.policy in ("drr_tokens", "drr_block_seconds") and c.order.drr_reset_when_idle),
         _VTC_SRC, step=HF.s_no_banked_credit, state_part=P.lift_and_tier_counters, history=HF.h_no_banked_credit,
         needs=("steps", "books"),
         why="the lift (the counter of the last tenant whose queue emptied) and, under floors, the tier counters "
             "are the model's own; records carry tenant counters only"),
    _inv("DRR-DEFICIT", "deficits within the carry bound (and (-D, q*w] with ample KV); service gap <= 2q + "
         "D/w_f + D/w_g", "7.2", _pol("drr_tokens", "drr_block_seconds"), _DRR_SRC,
         step=HF.s_drr_deficit, history=HF.h_drr_deficit, needs=("steps", "deficits")),
    _inv("FLOOR", "backlogged tiers' service per unit of floor differs by <= D/f_a + D/f_b", "7.2",
         lambda c: c.order.policy == "floors" and c.order.lift and (ample_kv(c) or skip_budget_claimed(c)),
         _VTC_SRC + " (applied to tiers)",
         state=P.check_floor, history=HF.h_floor, needs=_STEPS,
         why="the tier counters are the model's own (not recorded): the state form bounds their spread at every "
             "step; the record form bounds the tiers' service gap over intervals of steps"),
    _inv("AGING", "no request is scheduled while one with smaller tier + rate*arrival_s waits", "7.2",
         lambda c: c.order.policy == "aging" and ample_kv(c), step=HF.s_aging, history=HF.h_aging, needs=_STEPS),
    _inv("GUARD", "no request enters the batch while an overdue head that does not fit waits; the pool is "
         "reserved for it; no backlogged tenant is passed over more than guard_skips times", "7.2",
         lambda c: c.order.guard_steps is not None or c.order.guard_wait_s is not None
         or c.order.guard_skips is not None,
         state=P.check_guard, why=_GUARD_WHY),
    _inv("BOUNDED-WAIT", "a request of a tenant with max_wait_s is scheduled within max_wait_s of its arrival",
         "7.2", lambda c: any(t.max_wait_s is not None for t in c.tenants), history=C.h_bounded_wait),
    _inv("FCFS-TENANT", "within a tenant, requests are first scheduled in admission order", "7.2", _always,
         history=C.h_fcfs_tenant, needs=_STEPS),
    _inv("FCFS-TIER", "within a tier, requests are first scheduled in admission order (past one that surely "
         "did not fit)", "7.2", _pol("fcfs"), history=C.h_fcfs_tier, needs=_HELD),
    _inv("TIER-ORDER", "no request is first scheduled while a higher tier's earlier request waits and surely "
         "fits", "7.2", lambda c: c.order.policy == "priority" or c.order.strict_tiers, history=C.h_tier_order,
         needs=_HELD),
    _inv("TOKEN-BUCKET", "bucket moves by refill minus admitted and produced tokens; admitted prompts in any "
         "window <= burst + rate*T", "7.3",
         lambda c: c.admission.token_bucket and any(t.token_rate_per_s is not None for t in c.tenants),
         state=P.check_token_bucket, history=HE.h_token_bucket,
         why="the bucket's level is the model's own: the state form checks its exact bookkeeping at every step "
             "(so it catches a bucket that charges too much); records carry admissions, not levels, so the record "
             "form bounds what is admitted over every window of time"),
    _inv("TOKEN-LIMIT", "with output reservation, prompt + output tokens charged in any window <= burst + "
         "rate*T", "7.3",
         lambda c: c.admission.token_bucket and c.admission.reserve_output
         and any(t.token_rate_per_s is not None for t in c.tenants), history=HE.h_token_limit),
    _inv("REQUEST-RATE", "admitted requests in any window <= burst + rate*T", "7.3",
         lambda c: c.admission.request_rate_limit and any(t.request_rate_per_s is not None for t in c.tenants),
         history=C.h_request_rate),
    _inv("EVICT-MIN-FREE", "an eviction for another sequence frees >= min_free_blocks", "7.4",
         lambda c: c.eviction.min_free_blocks > 0, step=HE.s_evict_min_free, history=HE.h_evict_min_free,
         needs=_STEPS),
    _inv("EVICT-COOLDOWN", "a preempted request stays out of the batch for cooldown_steps steps", "7.4",
         _always, step=HE.s_evict_cooldown, state_part=P.cooldown_ready_step, history=HE.h_evict_cooldown,
         needs=_STEPS,
         why="a waiting request's ready step is the model's own, and the steps after trust it; records imply it "
             "from the step of the preemption, which one step's view does not see"),
    _inv("EVICT-BOUNDED", "preemptions <= max_evictions; waste <= preemptions*(prompt+output-1)", "7.4",
         _always, step=HE.s_evict_bounded, history=HE.h_evict_bounded),
    _inv("PRIORITY-PREEMPT", "a waiting higher tier preempts a lower tier for a slot, within the hysteresis, "
         "and only then", "7.4", lambda c: c.eviction.preempt_for_priority, state=P.check_priority_preempt,
         why=_PREEMPT_WHY),
    _inv("EVICT-MINIMAL", "no victim is taken once the step's batch has room", "7.4",
         lambda c: not caps_enforced(c), history=C.h_evict_minimal, always=True, needs=_HELD),
    _inv("EVICT-PROGRESS", "a step evicts only when its batch needs more blocks than are free, and every eviction "
         "frees blocks", "7.4", lambda c: not caps_enforced(c), history=C.h_evict_progress, needs=_HELD),
    _inv("VICTIM", "each victim is first in the victim policy's order among running sequences", "7.4",
         lambda c: c.eviction.victim in ("newest", "lowest_priority", "largest") and c.eviction.min_free_blocks == 0
         and not caps_enforced(c), step=HE.s_victim, history=HE.h_victim, needs=_STEPS),
    _inv("SALT-ISOLATION", "no request holds a block last written under another salt", "7.5",
         lambda c: c.prefix_cache == "salted", state=P.check_salt_isolation, history=HB.h_salt_isolation,
         needs=("steps", "block_ids"),
         why="the model's cache registers each key's salt, which the state form reads; records carry block ids, "
             "whose writers the record form follows over the whole run, which one step's view does not see"),
    _inv("NONINTERFERENCE", "a tenant's records do not depend on another tenant's prompt contents", "7.5",
         lambda c: c.prefix_cache in ("off", "salted"), pair=_pair_noninterference),
    _inv("DETERMINISM", "same configuration and workload give the same history, byte for byte", "7.6",
         _always, pair=_pair_determinism),
)}

#: Ids a scheduler may claim beyond the safety ones (derived from the registry).
CLAIMABLE = tuple(i for i, inv in INVARIANTS.items() if not inv.always)
#: History forms that judge only step records: on a history without step lines
#: (request records only) their verdict is unknown, not "holds" (SPEC.md 6).
HISTORY_NEEDS_STEPS = frozenset(i for i, inv in INVARIANTS.items() if "steps" in inv.needs)


def unknown_without_steps(history: History, claims: Any = None) -> list[str]:
    """Ids whose history form applies but cannot judge ``history`` because it has no step lines."""
    if history.steps:
        return []
    config, _ = _claims(history, claims)
    return [i for i in sorted(HISTORY_NEEDS_STEPS) if INVARIANTS[i].applies(config)]


def missing(inv: Invariant, history: History, config: Config) -> str | None:
    """What ``history`` lacks for ``inv``'s history form (a live recording's: its live form,
    SPEC.md 7.10), as a reason; None if nothing."""
    if L.is_live(history):
        return L.live_missing(inv.id, inv.needs, history)
    steps = history.steps
    shareable = config.prefix_cache != "off" and any(r.prefix_ids for r in history.requests)
    for need in inv.needs:
        if need == "steps" and not steps:
            return "the history has no step records"
        if need == "held" and shareable and not any(s.held is not None for s in steps):
            return "blocks per request are not recorded and the prefix cache can share blocks"
        if need == "block_ids" and not any(s.block_ids for s in steps):
            return ("no block ids are recorded (the scheduler does not report them; the model records them "
                    "with simulate --history --detail)")
        if need == "books":  # the policy's own books: VTC counters, DRR deficits (floors' tier counters: none)
            if config.order.policy == "floors":
                return "tier counters are not recorded in histories (the state form checks them)"
            need = "deficits" if config.order.policy.startswith("drr") else "counters"
        if need == "counters" and steps and not any(s.counters for s in steps):
            return "the scheduler reports no counters"
        if need == "deficits" and steps and not any(s.deficits for s in steps):
            return "the scheduler reports no deficits"
    return None


def coverage(history: History, claims: Any = None, ids: Iterable[str] | None = None) -> dict[str, str]:
    """What :func:`check_history` judges on ``history``: invariant id -> ``checked``
    or the reason it is not (not applicable to the configuration, not claimed,
    what the history lacks, no history form).  Every id of the registry appears."""
    config, claimed = _claims(history, claims)
    chosen = INVARIANTS if ids is None else {i: INVARIANTS[i] for i in ids}
    live = L.is_live(history)
    out = {}
    for i, inv in chosen.items():
        if live and i not in L.LIVE_FORMS:  # what a client cannot see, whatever is claimed
            out[i] = "skipped: " + missing(inv, history, config)
        elif not live and inv.check_history is None:
            out[i] = "no history form (" + ("two-run property" if inv.check_pair else
                                            f"state form only: {inv.state_only}") + ")"
        elif not inv.applies(config):
            out[i] = "not applicable to this configuration"
        elif claimed is not None and not inv.always and i not in claimed:
            out[i] = "not claimed"
        else:
            out[i] = "skipped: " + why if (why := missing(inv, history, config)) else "checked"
    return out


def _select(config: Config, ids: Iterable[str] | None) -> list[Invariant]:
    chosen = INVARIANTS.values() if ids is None else [INVARIANTS[i] for i in ids]
    return [inv for inv in chosen if inv.applies(config)]


def check_state(config: Config, prev: State, state: State, output: StepOutput, inputs: StepInput = StepInput(),
                ids: Iterable[str] | None = None, record: StepRecord | None = None,
                prev_record: StepRecord | None = None) -> list[Finding]:
    """Judge one step: every applicable invariant's state form.

    Args:
        prev, state: the states before and after the step; output: its StepOutput;
        inputs: the step's arrivals and cancellations; ids: restrict to these ids;
        record, prev_record: the step's record and the one before it when the caller
            made them (a :class:`~tenantry.runner.simulate.Recorder`'s, with ``detail``): the
            state forms derived from record forms read them (else they are made here).

    Raises:
        KeyError: on an unknown invariant id.
    """
    ctx = S.StepContext(config, prev, inputs, state, output, record, prev_record)
    out: list[Finding] = []
    for inv in _select(config, ids):
        if inv.check_state is not None:
            try:
                out += inv.check_state(ctx)
            except Exception as e:  # one check that raises must not end the run: a finding
                out.append(check_raised(inv.id, e, output.step_index))
    return out


def _claims(history: History, claims: Any) -> tuple[Config, set[str] | None]:
    if claims is None:
        return config_from_dict(history.header.get("config") or {}), None
    if isinstance(claims, Config):
        return claims, None
    claimed = claims.claimed() if hasattr(claims, "claimed") else None
    return claims.config, (set(claimed) if claimed is not None else None)


def check_history(history: History, claims: Any = None, ids: Iterable[str] | None = None) -> list[Finding]:
    """Judge a recorded history with every applicable invariant's history form.

    Args:
        claims: see the module docstring.  When claims name the invariants they
            assert (``claimed()``), only those and the safety ones are checked.
        ids: restrict to these ids.

    Raises:
        ConfigError: if the configuration cannot be read from the header.
    """
    config, claimed = _claims(history, claims)
    hctx = H.HistoryContext(history, config)
    live = L.is_live(history)
    out: list[Finding] = []
    for inv in _select(config, ids):
        form = L.LIVE_FORMS.get(inv.id) if live else inv.check_history  # a live recording: its live form
        if form is None:
            continue
        if claimed is not None and not inv.always and inv.id not in claimed:
            continue
        if missing(inv, history, config) is not None:
            continue
        try:
            out += form(hctx)
        except Exception as e:  # one check that raises must not end the run: a finding
            out.append(check_raised(inv.id, e))
    return out


def check_pair(invariant_id: str, a: History, b: History, **kw: Any) -> list[Finding]:
    """Judge a two-run property (DETERMINISM, NONINTERFERENCE with ``observer=``)."""
    inv = INVARIANTS[invariant_id]
    if inv.check_pair is None:
        raise ValueError(f"{invariant_id} has no two-run form; use check_state or check_history")
    try:
        return inv.check_pair(a, b, **kw)
    except Exception as e:  # one check that raises must not end the run: a finding
        return [check_raised(invariant_id, e)]


def relabel_contents(workload: Workload | Iterable[Request], tenant: str, offset: int) -> Workload:
    """The NONINTERFERENCE twin: ``tenant``'s prefix content ids shifted by ``offset``.

    An injective relabelling keeps which of the tenant's own prompts share
    prefixes (so its own cache hits are unchanged) but changes every content
    id, so any dependence of another tenant on these contents shows.
    """
    reqs = workload.requests if isinstance(workload, Workload) else tuple(workload)
    return Workload(tuple(attrs.evolve(r, prefix_ids=tuple(x + offset for x in r.prefix_ids)) if r.tenant == tenant
                          else r for r in reqs))
