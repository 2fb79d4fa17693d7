"""Shared pieces of the invariant catalog: findings, the invariant record, and
the bounds derived from a configuration (SPEC.md section 7).

A :class:`Finding` is data first (Elle's anomaly maps): which invariant, at
which step, which tenants and requests, the number observed and the number
allowed; ``str(finding)`` renders it as one sentence.  An :class:`Invariant`
is a small record of functions (Porcupine's model record): ``applies(config)``,
and a state form, a history form and/or a two-run form.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs

from tenantry.model.config import Config

#: Absolute slack for float comparisons of accumulated counters (weighted tokens,
#: seconds).  Counters are sums of at most a few million products of floats, so
#: their rounding error is far below this.
EPS = 1e-6


@attrs.frozen
class Finding:
    """One broken invariant, as data.

    Attributes:
        invariant: the invariant id (``KV-CONSERVE``, ``VTC-GAP``, ...).
        step: step index where it shows; None for a whole-run property.
        tenants: tenant names involved (possibly empty).
        requests: request ids involved (possibly empty).
        observed: the observed value (a number where there is one).
        allowed: the bound or the expected value.
        message: one line saying what broke, in the invariant's words.
    """

    invariant: str
    step: int | None
    tenants: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    requests: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    observed: Any = None
    allowed: Any = None
    message: str = ""

    def __str__(self) -> str:
        where = "whole run" if self.step is None else f"step {self.step}"
        who = []
        if self.tenants:
            who.append("tenants " + ", ".join(self.tenants))
        if self.requests:
            shown = ", ".join(str(r) for r in self.requests[:6]) + (", ..." if len(self.requests) > 6 else "")
            who.append("requests " + shown)
        parts = f" ({'; '.join(who)})" if who else ""
        return f"{self.invariant} at {where}{parts}: {self.message} (observed {_fmt(self.observed)}, allowed {_fmt(self.allowed)})."


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


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
    """

    id: str
    summary: str
    spec: str
    applies: Callable[[Config], bool]
    source: str = ""
    check_state: StateCheck | None = None
    check_history: HistoryCheck | None = None
    check_pair: PairCheck | None = None

    @property
    def forms(self) -> tuple[str, ...]:
        """Which forms exist: a subset of ("state", "history", "pair")."""
        return tuple(n for n, f in (("state", self.check_state), ("history", self.check_history),
                                    ("pair", self.check_pair)) if f is not None)


# --- applicability predicates -------------------------------------------------------


def caps_enforced(config: Config) -> bool:
    """Some tenant has a KV block cap and the admission config enforces caps."""
    return config.admission.kv_cap and any(t.kv_block_cap is not None for t in config.tenants)


def ample_kv(config: Config) -> bool:
    """The KV pool can never bind: every admitted request fits whatever else runs.

    True when no tenant KV cap is enforced and ``num_blocks >= max_num_seqs *
    blocks_for(max_context_tokens)``: then no allocation is ever short, no
    sequence is preempted, and no queue head is skipped for lack of blocks, so
    the scheduling order is exactly the policy's (SPEC.md 7, "ample KV").
    """
    if caps_enforced(config):
        return False
    return config.num_blocks >= config.max_num_seqs * config.blocks_for(config.max_context_tokens)


def batch_token_capacity(config: Config, max_total_tokens: int | None = None) -> int:
    """M: the most tokens (prompt plus output) the sequences of one batch can reach.

    ``min(num_blocks * block_size_tokens, max_num_seqs * T)`` with T the
    longest request (prompt + output, tokens): ``max_total_tokens`` when the
    workload is known, else ``max_context_tokens``.
    """
    t = config.max_context_tokens if max_total_tokens is None else min(max_total_tokens, config.max_context_tokens)
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


def tier_share(config: Config, tier: int) -> float:
    """The floor share of ``tier`` under policy ``floors`` (last floor for tiers past the end)."""
    f = config.order.tier_floors
    return f[min(tier, len(f) - 1)]
