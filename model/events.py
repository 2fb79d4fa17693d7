"""Events: what can happen to a request in a step, and how a request can end (SPEC.md 5.2).

The step (:mod:`tenantry.model.step`) reports each thing that happened to a
request as an :class:`Event`; a history (:mod:`tenantry.runner.history`)
records them.  The vocabularies here (outcomes, refusal reasons, event kinds)
are the model's, shared by every reader and writer of records.
"""

from __future__ import annotations

import attrs

#: Terminal outcomes of a request (SPEC.md 5).  ``unfinished`` only appears
#: when a run stops at its horizon with the request still queued or running.
OUTCOMES = ("finished", "rejected", "cancelled", "unfinished")

#: Reasons of a ``rejected`` outcome.  Each refusal at admission is a 429.
REJECT_REASONS = (
    "too_long",          # prompt + output exceeds max_context_tokens
    "too_large",         # needs more KV blocks than the pool or the tenant's cap: can never fit
    "rate_limit",        # request-rate limit
    "token_bucket",      # token bucket empty
    "queue_full",        # tenant queue at its bound
    "kv_watermark",      # pool above the tier's watermark
    "estimated_wait",    # the tier's estimated queue wait over its limit
    "evicted_too_often", # preempted max_evictions times and chosen again
)
#: The reasons given at admission (a refusal before the request was ever queued).
ADMISSION_REASONS = tuple(r for r in REJECT_REASONS if r != "evicted_too_often")
#: Reasons of a ``preempted`` event: ``priority`` when a waiting higher tier took
#: the victim's place (``eviction.preempt_for_priority``, SPEC.md 4.5); no reason
#: when the victim made room for a running sequence.
PREEMPT_REASONS = ("priority",)
#: Events that end a request (SPEC.md 5.2).
TERMINAL = ("finished", "cancelled", "rejected")


#: Kinds of a step record's events (SPEC.md 5.2 and 6), in the order they can
#: happen to a request: ``scheduled`` is its entry into the batch (``tokens``:
#: tokens already computed at entry, prefix-cache hits).
EVENT_KINDS = ("queued", "rejected", "cancelled", "preempted", "scheduled", "first_token", "finished")


@attrs.frozen(slots=True)
class Event:
    """Something that happened to one request in a step.

    Attributes:
        kind: one of :data:`EVENT_KINDS`.
        request_id, tenant (index): whose.
        t_s: when (seconds): arrival time for queued/rejected at admission,
            end of the step for first_token/finished, start of the step for
            cancelled, preempted and scheduled.
        reason, retry_after_s: for ``rejected`` (a 429): why and when to retry
            (seconds, None when retrying cannot help).
        tokens: ``preempted``: computed tokens discarded; ``scheduled``: tokens
            already computed at entry (prefix-cache hits); ``finished``: tokens generated.
        blocks: ``preempted`` (and ``rejected`` evicted_too_often): blocks its eviction released.
    """

    kind: str
    request_id: int
    tenant: int
    t_s: float
    reason: str | None = None
    retry_after_s: float | None = None
    tokens: int = 0
    blocks: int = 0
