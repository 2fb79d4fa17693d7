"""Did an invariant break?  The bridge from a run to the invariant catalog.

Sources, in this order:

1. **spec**: the registry of :mod:`tenantry.spec.invariants` (``INVARIANTS``,
   ``check_state``, ``check_history``, ``check_pair``, ``relabel_contents``).
   Three depths (:data:`DEPTHS`):

   * ``history``: simulate, then every requested invariant's history form
     (one pass over the recorded history; used for every search evaluation);
   * ``state``: step the model here and call the state forms after every
     step, then the history forms;
   * ``full``: ``state`` plus the two-run forms: DETERMINISM (the run again,
     byte for byte) and NONINTERFERENCE (each adversary tenant observing
     while every victim's prompt contents are relabelled).

2. **local**: when the registry cannot be imported, the few history checks
   of :data:`LOCAL_CHECKS`; the other ids are reported as unchecked.

:func:`source_label` says which source is in force, so a report can label its
"invariant" column honestly.  Only invariants that apply to the configuration
(``INVARIANTS[id].applies(config)``) are checked; the rest are unchecked.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable, Sequence

from tenantry.model.config import Config
from tenantry.model.history import History
from tenantry.model.simulate import Recorder, check_workload, config_to_dict, has_work, simulate
from tenantry.model.state import initial_state
from tenantry.model.step import idle, step
from tenantry.model.workload import StepInput, Workload

#: How deep :func:`run_checked` checks.
DEPTHS = ("history", "state", "full")
#: Content-id offset of the NONINTERFERENCE twin (far above any id in use).
RELABEL_OFFSET = 10**9


def _spec() -> Any | None:
    """The module :mod:`tenantry.spec.invariants`, or None when it cannot be imported."""
    try:
        mod = importlib.import_module("tenantry.spec.invariants")
    except ImportError:
        return None
    return mod if isinstance(getattr(mod, "INVARIANTS", None), dict) else None


def source_label() -> str:
    """``spec`` when the spec registry is in force, else ``local``."""
    return "spec" if _spec() is not None else "local"


# --- local fallback ----------------------------------------------------------------


def _local_no_loss(cfg: Config, wl: Workload, h: History) -> list[str]:
    out = []
    if {r.request_id for r in h.requests} != {r.request_id for r in wl}:
        out.append(f"NO-LOSS: {len(h.requests)} request records for {len(wl)} requests")
    for r in h.requests:
        if r.outcome == "finished" and r.tokens_generated != r.output_tokens:
            out.append(f"NO-LOSS: request {r.request_id} finished with {r.tokens_generated} of {r.output_tokens} tokens")
    return out


def _local_kv_cap(cfg: Config, wl: Workload, h: History) -> list[str]:
    caps = {t.name: t.kv_block_cap for t in cfg.tenants} if cfg.admission.kv_cap else {}
    out = [f"KV-CAP: step {s.step_index}: free blocks {s.free_blocks} < 0" for s in h.steps if s.free_blocks < 0]
    for s in h.steps:
        out += [f"KV-CAP: step {s.step_index}: {t} holds {b} blocks, cap {caps[t]}"
                for t, b in s.blocks_in_use.items() if caps.get(t) is not None and b > caps[t]]
    return out


def _local_evict_bounded(cfg: Config, wl: Workload, h: History) -> list[str]:
    k = cfg.eviction.max_evictions
    return [] if k is None else [f"EVICT-BOUNDED: request {r.request_id} evicted {r.preemptions} times, bound {k}"
                                 for r in h.requests if r.preemptions > k]


#: Invariant id -> local history check ``(config, workload, history) -> [sentence]``.
LOCAL_CHECKS: dict[str, Callable[[Config, Workload, History], list[str]]] = {
    "NO-LOSS": _local_no_loss, "KV-CAP": _local_kv_cap, "EVICT-BOUNDED": _local_evict_bounded,
}


# --- the checked run ---------------------------------------------------------------


def drive(config: Config, workload: Workload, horizon_s: float,
          on_step: Callable[[Any, StepInput, Any, Any], None] | None = None) -> History:
    """:func:`tenantry.model.simulate.simulate`'s loop (same delivery and stopping
    rules, with ``horizon_s``), calling ``on_step(prev, inputs, state, output)``
    after every step."""
    if on_step is None:
        return simulate(config, workload, horizon_s=horizon_s)
    check_workload(config, workload)
    reqs = workload.requests
    rec = Recorder(config, True)
    for r in reqs:
        rec.offered(r)
    state = initial_state(config)
    i = 0
    while True:
        if not has_work(state):
            if i == len(reqs) or reqs[i].arrival_s >= horizon_s:
                break
            if reqs[i].arrival_s > state.t_s:
                state = idle(config, state, reqs[i].arrival_s)
        if state.t_s >= horizon_s:
            break
        j = i
        while j < len(reqs) and reqs[j].arrival_s <= state.t_s:
            j += 1
        inputs = StepInput(arrivals=reqs[i:j])
        i = j
        prev = state
        state, out = step(config, prev, inputs)
        rec.observe(state, out)
        on_step(prev, inputs, state, out)
    return rec.history(state, {"config": config_to_dict(config), "requests": len(reqs)})


def _add(broken: dict[str, list[str]], findings: Iterable[Any], limit: int) -> None:
    for f in findings:
        lst = broken.setdefault(f.invariant, [])
        if len(lst) < limit:
            lst.append(str(f))


def run_checked(config: Config, workload: Workload, horizon_s: float, ids: Iterable[str], *,
                depth: str = "history", adversaries: Sequence[str] = (), max_findings: int = 5,
                ) -> tuple[History, dict[str, list[str]], tuple[str, ...]]:
    """Run ``workload`` on ``config`` until ``horizon_s`` and check the invariants ``ids``.

    Args:
        depth: one of :data:`DEPTHS`.
        adversaries: the adversary tenants (NONINTERFERENCE observers at depth ``full``).

    Returns:
        (history, {id: finding sentences} for the ids that broke, ids left
        unchecked: not in the registry, not applicable to ``config``, or with
        no form run at this depth).

    Raises:
        ValueError: on an unknown depth.
    """
    if depth not in DEPTHS:
        raise ValueError(f"depth={depth!r}: choose one of {', '.join(DEPTHS)}")
    ids = tuple(dict.fromkeys(ids))
    spec = _spec()
    broken: dict[str, list[str]] = {}
    if spec is None:
        h = simulate(config, workload, horizon_s=horizon_s)
        for i in ids:
            if i in LOCAL_CHECKS:
                msgs = LOCAL_CHECKS[i](config, workload, h)
                if msgs:
                    broken[i] = msgs[:max_findings]
        return h, broken, tuple(i for i in ids if i not in LOCAL_CHECKS)
    reg = spec.INVARIANTS
    live = [i for i in ids if i in reg and reg[i].applies(config)]
    state_ids = [i for i in live if reg[i].check_state is not None] if depth != "history" else []
    hist_ids = [i for i in live if reg[i].check_history is not None]
    pair_ids = [i for i in live if reg[i].check_pair is not None] if depth == "full" else []

    def on_step(prev, inputs, state, out) -> None:
        _add(broken, spec.check_state(config, prev, state, out, inputs, state_ids), max_findings)

    h = drive(config, workload, horizon_s, on_step if state_ids else None)
    if hist_ids:
        _add(broken, spec.check_history(h, config, hist_ids), max_findings)
    if "DETERMINISM" in pair_ids:  # two runs of the public driver, byte for byte
        first = h if not state_ids else simulate(config, workload, horizon_s=horizon_s)
        _add(broken, spec.check_pair("DETERMINISM", first, simulate(config, workload, horizon_s=horizon_s)),
             max_findings)
    if "NONINTERFERENCE" in pair_ids and adversaries:
        twin = workload
        for t in {r.tenant for r in workload} - set(adversaries):
            twin = spec.relabel_contents(twin, t, RELABEL_OFFSET)
        h2 = simulate(config, twin, horizon_s=horizon_s)
        for obs in adversaries:
            _add(broken, spec.check_pair("NONINTERFERENCE", h, h2, observer=obs), max_findings)
    done = set(state_ids) | set(hist_ids) | set(pair_ids if adversaries else [i for i in pair_ids if i != "NONINTERFERENCE"])
    return h, broken, tuple(i for i in ids if i not in done)
