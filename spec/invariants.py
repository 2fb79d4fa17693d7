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
from tenantry.model.history import History, history_lines
from tenantry.model.setups import config_from_dict
from tenantry.model.state import State
from tenantry.model.step import StepOutput
from tenantry.model.workload import Request, StepInput, Workload

from . import invariants_history as H
from . import invariants_policy as P
from . import invariants_state as S
from .invariants_core import Finding, Invariant, ample_kv, caps_enforced

__all__ = ["INVARIANTS", "HISTORY_NEEDS_STEPS", "Finding", "Invariant", "check_state", "check_history", "check_pair",
           "config_from_dict", "relabel_contents", "unknown_without_steps"]

_VTC_SRC = "Sheng et al., Fairness in Serving Large Language Models, OSDI 2024, Algorithm 2 and Theorem 4.4"
_DRR_SRC = "Shreedhar and Varghese, Efficient Fair Queueing Using Deficit Round Robin, SIGCOMM 1995, Lemma 2"


def _always(config: Config) -> bool:
    return True


def _pair_determinism(a: History, b: History, **_: Any) -> list[Finding]:
    """DETERMINISM (SPEC.md 7.6): two runs of one configuration and workload
    serialise to the same bytes; the finding names the first line that differs."""
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


def _inv(id, summary, spec, applies, source="", state=None, history=None, pair=None) -> Invariant:
    return Invariant(id=id, summary=summary, spec=spec, applies=applies, source=source,
                     check_state=state, check_history=history, check_pair=pair)


_pol = lambda *names: (lambda c: c.order.policy in names)

INVARIANTS: dict[str, Invariant] = {i.id: i for i in (
    _inv("KV-CONSERVE", "free + held = pool; refcounts match holders; waiting requests hold nothing", "7.1",
         _always, state=S.check_kv_conserve, history=H.h_kv_conserve),
    _inv("KV-CAP", "blocks in use <= pool; each tenant <= its enforced cap", "7.1",
         _always, state=S.check_kv_cap, history=H.h_kv_cap),
    _inv("QUEUE-BOUND", "never-scheduled queued requests <= bound; overflow refused queue_full at once", "7.1",
         lambda c: c.admission.queue_bound and any(t.queue_bound is not None for t in c.tenants),
         state=S.check_queue_bound, history=H.h_queue_bound),
    _inv("NO-LOSS", "every request in one place, ending once as finished, rejected (with reason) or cancelled",
         "7.1", _always, state=S.check_no_loss, history=H.h_no_loss),
    _inv("BATCH-LIMITS", "sequences <= max_num_seqs, tokens <= token_budget, preempted never in the batch", "7.1",
         _always, state=S.check_batch_limits, history=H.h_batch_limits),
    _inv("WORK-CONSERVING", "no unused slot and budget while a ready waiting request surely fits", "7.1",
         _always, state=S.check_work_conserving),
    _inv("VTC-GAP", "backlogged tenants' normalised service differs by <= D/w_f + D/w_g", "7.2",
         lambda c: c.order.policy == "vtc" and c.order.lift and ample_kv(c), _VTC_SRC,
         state=P.check_vtc_gap, history=H.h_vtc_gap),
    _inv("NO-BANKED-CREDIT", "a newly backlogged tenant starts at >= the least backlogged counter; idle DRR "
         "tenants keep no deficit", "7.2",
         lambda c: (c.order.policy in ("vtc", "floors") and c.order.lift) or (
             c.order.policy in ("drr_tokens", "drr_block_seconds") and c.order.drr_reset_when_idle),
         _VTC_SRC, state=P.check_no_banked_credit,
         history=lambda h: H.h_no_banked_credit(h) if h.config.order.policy == "vtc" else []),
    _inv("DRR-DEFICIT", "deficits within the carry bound (and (-D, q*w] with ample KV); service gap <= 2q + "
         "D/w_f + D/w_g", "7.2", _pol("drr_tokens", "drr_block_seconds"), _DRR_SRC,
         state=P.check_drr_deficit, history=H.h_drr_deficit),
    _inv("FLOOR", "backlogged tiers' service per unit of floor differs by <= D/f_a + D/f_b", "7.2",
         lambda c: c.order.policy == "floors" and c.order.lift and ample_kv(c), _VTC_SRC + " (applied to tiers)",
         state=P.check_floor, history=H.h_floor),
    _inv("AGING", "no request is scheduled while one with smaller tier + rate*arrival_s waits", "7.2",
         lambda c: c.order.policy == "aging" and ample_kv(c), state=P.check_aging, history=H.h_aging),
    _inv("TOKEN-BUCKET", "bucket moves by refill minus admitted and produced tokens; admitted prompts in any "
         "window <= burst + rate*T", "7.3",
         lambda c: c.admission.token_bucket and any(t.token_rate_per_s is not None for t in c.tenants),
         state=P.check_token_bucket, history=H.h_token_bucket),
    _inv("EVICT-MIN-FREE", "an eviction for another sequence frees >= min_free_blocks", "7.4",
         lambda c: c.eviction.min_free_blocks > 0, state=P.check_evict_min_free),
    _inv("EVICT-COOLDOWN", "a preempted request stays out of the batch for cooldown_steps steps", "7.4",
         _always, state=P.check_evict_cooldown, history=H.h_evict_cooldown),
    _inv("EVICT-BOUNDED", "preemptions <= max_evictions; waste <= preemptions*(prompt+output-1)", "7.4",
         _always, state=P.check_evict_bounded, history=H.h_evict_bounded),
    _inv("VICTIM", "each victim is first in the victim policy's order among running sequences", "7.4",
         lambda c: c.eviction.victim in ("newest", "lowest_priority", "largest") and c.eviction.min_free_blocks == 0
         and not caps_enforced(c), state=P.check_victim,
         history=lambda h: H.h_victim(h) if h.config.eviction.victim in ("newest", "lowest_priority") else []),
    _inv("SALT-ISOLATION", "no request references a cached block registered under another salt", "7.5",
         lambda c: c.prefix_cache == "salted", state=P.check_salt_isolation),
    _inv("NONINTERFERENCE", "a tenant's records do not depend on another tenant's prompt contents", "7.5",
         lambda c: c.prefix_cache in ("off", "salted"), pair=_pair_noninterference),
    _inv("DETERMINISM", "same configuration and workload give the same history, byte for byte", "7.6",
         _always, pair=_pair_determinism),
)}


#: History forms that judge only step snapshots: on a history without step lines
#: (request records only) their verdict is unknown, not "holds" (SPEC.md 6).
HISTORY_NEEDS_STEPS = frozenset({
    "KV-CONSERVE", "KV-CAP", "QUEUE-BOUND", "BATCH-LIMITS", "VTC-GAP", "NO-BANKED-CREDIT", "DRR-DEFICIT",
    "FLOOR", "AGING", "EVICT-COOLDOWN", "VICTIM",
})


def unknown_without_steps(history: History, claims: Any = None) -> list[str]:
    """Ids whose history form applies but cannot judge ``history`` because it has no step lines."""
    if history.steps:
        return []
    config, _ = _claims(history, claims)
    return [i for i in sorted(HISTORY_NEEDS_STEPS) if INVARIANTS[i].applies(config)]


def _select(config: Config, ids: Iterable[str] | None) -> list[Invariant]:
    chosen = INVARIANTS.values() if ids is None else [INVARIANTS[i] for i in ids]
    return [inv for inv in chosen if inv.applies(config)]


def check_state(config: Config, prev: State, state: State, output: StepOutput, inputs: StepInput = StepInput(),
                ids: Iterable[str] | None = None) -> list[Finding]:
    """Judge one step: every applicable invariant's state form.

    Args:
        prev, state: the states before and after the step; output: its StepOutput;
        inputs: the step's arrivals and cancellations; ids: restrict to these ids.

    Raises:
        KeyError: on an unknown invariant id.
    """
    ctx = S.StepContext(config, prev, inputs, state, output)
    out: list[Finding] = []
    for inv in _select(config, ids):
        if inv.check_state is not None:
            out += inv.check_state(ctx)
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
    out: list[Finding] = []
    for inv in _select(config, ids):
        if inv.check_history is None:
            continue
        if claimed is not None and inv.spec != "7.1" and inv.id not in claimed:
            continue
        out += inv.check_history(hctx)
    return out


def check_pair(invariant_id: str, a: History, b: History, **kw: Any) -> list[Finding]:
    """Judge a two-run property (DETERMINISM, NONINTERFERENCE with ``observer=``)."""
    inv = INVARIANTS[invariant_id]
    if inv.check_pair is None:
        raise ValueError(f"{invariant_id} has no two-run form; use check_state or check_history")
    return inv.check_pair(a, b, **kw)


def relabel_contents(workload: Workload | Iterable[Request], tenant: str, offset: int) -> Workload:
    """The NONINTERFERENCE twin: ``tenant``'s prefix content ids shifted by ``offset``.

    An injective relabelling keeps which of the tenant's own prompts share
    prefixes (so its own cache hits are unchanged) but changes every content
    id, so any dependence of another tenant on these contents shows.
    """
    reqs = workload.requests if isinstance(workload, Workload) else tuple(workload)
    return Workload(tuple(attrs.evolve(r, prefix_ids=tuple(x + offset for x in r.prefix_ids)) if r.tenant == tenant
                          else r for r in reqs))
