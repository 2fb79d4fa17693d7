"""Planted faults: small faulty schedulers behind the tenantry adapter protocol.

Each module of this package is one scheduler with one planted bug (``three_faults``
has three), written in the shape of a real scheduler on the shared base
(:mod:`faults.base`: a block pool with a salted prefix cache, per-tenant queues,
admission, chunked prefill, recompute preemption); its docstring names the
fault, the invariant expected to catch it and the bug it imitates.  Run from
``examples/``::

    tenantry verify --target faults.fcfs_lifo:make_scheduler --out report/

Registries:

* :data:`FAULTS`: name -> :class:`Fault` (factory spec, expected invariant ids,
  kind): each must be caught by ``tenantry verify --target`` with its defaults;
  :data:`PENDING` names those the defaults do not catch yet, with what is missing.
* :data:`CLEAN`: name -> factory spec of correct schedulers (no finding).
* :data:`GAPS`: name -> (factory spec, what happens): a fault tenantry cannot
  express, and a correct scheduler it flags (a false positive), kept as evidence.

``scripts/faults_table.py`` runs the default verification on every entry and
writes the table (the last one: ``README.md`` here); ``tests/test_faults.py``
replays each fault's stored witness workloads (``witness/``, listed with what
they raise in ``witness/index.json``).
"""

from __future__ import annotations

from typing import NamedTuple


class Fault(NamedTuple):
    """One planted fault: ``module:factory`` (importable from ``examples/``), the
    invariant ids expected to report it, and its kind (the brief's numbering)."""

    target: str
    expected: tuple[str, ...]
    kind: str


def _f(module: str, expected: str | tuple[str, ...], kind: str) -> Fault:
    return Fault(f"faults.{module}:make_scheduler", (expected,) if isinstance(expected, str) else expected, kind)


FAULTS: dict[str, Fault] = {
    "long_prompt_leak": _f("long_prompt_leak", "KV-CONSERVE", "1 search over pattern parameters"),
    "budget_plus_one": _f("budget_plus_one", "BATCH-LIMITS", "2 boundary: prompt of token_budget + 1"),
    "context_off_by_one": _f("context_off_by_one", "REFUSAL-TRUTH", "2 boundary: output at the context limit"),
    "pool_off_by_one": _f("pool_off_by_one", "REFUSAL-TRUTH", "2 boundary: exactly the pool"),
    "full_prefix_hit": _f("full_prefix_hit", "BATCH-LIMITS", "2 boundary: a prompt wholly in the prefix cache"),
    "cancel_prefill_leak": _f("cancel_prefill_leak", "KV-CONSERVE", "3 cancellation during prefill"),
    "cancel_prefill_in_batch": _f("cancel_prefill_in_batch", "NO-LOSS", "3 cancellation during prefill"),
    "three_faults": _f("three_faults", ("KV-CONSERVE", "REFUSAL-TRUTH", "WORK-CONSERVING"), "4 three faults"),
    "hash_order": _f("hash_order", "DETERMINISM", "5 string hash order"),
    "salt_dedupe": _f("salt_dedupe", "SALT-ISOLATION", "6 prefix cache across salts"),
    "stale_salt_at_finish": _f("stale_salt_at_finish", "SALT-ISOLATION",
                               "6 prefix cache across salts, written in a request's last step"),
    "sjf_starves": _f("sjf_starves", "BOUNDED-WAIT", "7 starving order with a bounded wait"),
    "fcfs_lifo": _f("fcfs_lifo", "FCFS-TENANT", "8 FCFS within a tenant"),
    "fcfs_tenant_major": _f("fcfs_tenant_major", "FCFS-TIER", "8 FCFS within a tier"),
    "priority_reversed": _f("priority_reversed", "TIER-ORDER", "8 tier order"),
    "rate_limit_units": _f("rate_limit_units", "REQUEST-RATE", "9 request-rate limit not applied"),
    "queue_full_counts_running": _f("queue_full_counts_running", "REFUSAL-TRUTH", "9 false refusal reason"),
    "evict_headroom": _f("evict_headroom", "EVICT-MINIMAL", "10 over-preemption"),
    "evict_watermark": _f("evict_watermark", "EVICT-PROGRESS", "10 preemption without progress"),
    "vtc_no_lift": _f("vtc_no_lift", "NO-BANKED-CREDIT", "11 VTC without the lift"),
    "vtc_prompt_only": _f("vtc_prompt_only", "VTC-GAP", "11 VTC not charging output tokens"),
    "vtc_weight_ignored": _f("vtc_weight_ignored", "VTC-GAP", "11 VTC ignoring the tenants' weights"),
    "over_preemption": _f("over_preemption", "EVICT-MINIMAL", "12 bug log: over-preemption (SGLang #12493)"),
    "rate_limit_stale": _f("rate_limit_stale", "REFUSAL-TRUTH", "12 bug log: rate limit under the limit (LiteLLM #37789)"),
    "free_overcounted": _f("free_overcounted", "KV-CONSERVE", "12 bug log: free blocks overcounted (SGLang #35270)"),
    "priority_full_seats": _f("priority_full_seats", "BOUNDED-WAIT", "12 bug log: priority inversion, full seats (vLLM #40004)"),
    "queue_bound_off_by_one": _f("queue_bound_off_by_one", "QUEUE-BOUND", "12 regression: queue bound off by one"),
    "preempted_in_batch": _f("preempted_in_batch", "BATCH-LIMITS", "12 regression: preempted sequence left in the batch"),
    "oversized_late": _f("oversized_late", "NO-LOSS", "12 regression: prompt larger than the pool not refused at once"),
    "cancel_decode_leak": _f("cancel_decode_leak", "KV-CONSERVE", "12 regression: cancel-at-every-stage block leak"),
    "evict_bound_off_by_one": _f("evict_bound_off_by_one", "EVICT-BOUNDED", "12 regression: eviction bound off by one"),
    "cooldown_ignored": _f("cooldown_ignored", "EVICT-COOLDOWN", "12 regression: cooldown ignored"),
    "raises_after_n": _f("raises_after_n", "ADAPTER-RAISED", "13 protocol: raises after N steps"),
    "hangs": _f("hangs", "ADAPTER-HANG", "13 protocol: hangs"),
    "plan_twice": _f("plan_twice", "BATCH-LIMITS", "13 protocol: a request twice in a plan"),
    "plan_overrun": _f("plan_overrun", "BATCH-LIMITS", "13 protocol: more tokens than remain"),
    "plan_too_many_seqs": _f("plan_too_many_seqs", "BATCH-LIMITS", "13 protocol: more sequences than max_num_seqs"),
    "token_bucket_output_free": _f("token_bucket_output_free", "TOKEN-LIMIT",
                                   "12 bug log: output tokens not reserved (LiteLLM #18730)"),
}

#: Faults that ``tenantry verify --target`` with its defaults does not catch yet: name -> what is missing.
PENDING: dict[str, str] = {
    "vtc_prompt_only": "reported VTC-GAP in every cell, but only by the counter premise of VTC-GAP's history form "
                       "(a counter moves by the tenant's new weighted service), which flags the same scheduler with "
                       "the fault removed just as well, on one request: a plan reports its counters before the step's "
                       "output tokens are charged (the scheduler charges them on the results), and the harness sets "
                       "them beside the service after the step. Not a catch. The service gap itself (bound 2D, D = "
                       "8,256 weighted tokens here) needs two tenants backlogged for longer than the 16-s scenarios "
                       "last: the hand-written witness passes it at step 811 (about 25 s).",
}

#: Correct schedulers: each must come out of the default verification with no finding.
CLEAN: dict[str, str] = {
    "minisched": "minisched.tenantry_adapter:make_scheduler",
    "clean_rr": "faults.clean_rr:make_scheduler",
    "clean_vtc_cache": "faults.clean_vtc_cache:make_scheduler",
    "fp_cache_at_finish": "faults.fp_cache_at_finish:make_scheduler",
}

#: Evidence of what tenantry cannot judge today: name -> (factory spec, what happens).
GAPS: dict[str, tuple[str, str]] = {}  # none today: the last two were fixed (see README.md)

__all__ = ["Fault", "FAULTS", "PENDING", "CLEAN", "GAPS"]
