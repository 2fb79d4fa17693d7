"""Findings of the adapter harness: data first, a sentence second (Elle's anomaly maps).

A :class:`Finding` names the invariant or protocol rule broken, the step, the
tenant and request, the observed value and the allowed one, and, when a call
into the scheduler under test is to blame, that call.  The harness's own
protocol ids live in :data:`PROTOCOL`; invariant ids are the catalog's
(DESIGN.md, SPEC.md section 7).
"""

from __future__ import annotations

from typing import Any

import attrs

#: Harness-level ids: the scheduler broke the adapter protocol, not an invariant.
#: Impossible plans that an invariant already names are reported under it: a
#: request twice in the batch, or preempted and batched in one step, is
#: BATCH-LIMITS; an unknown or already ended request in a plan is NO-LOSS; more
#: blocks than the pool is KV-CAP.
PROTOCOL = {
    "ADAPTER-RAISED": "a call into the scheduler raised an exception",
    "ADAPTER-HANG": "a call into the scheduler did not return within the per-call timeout",
    "ADAPTER-CLAIMS": "the adapter has no valid `claims` (a tenantry.verify.protocol.Claims)",
    "PLAN-MALFORMED": "plan_step returned something that is not a Plan of the right shape",
    "PLAN-NOT-RUNNING": "the plan preempts a request that holds no KV (not running)",
    "PLAN-TOKENS": "a batch entry computes no token, or more tokens than the request has left",
    "PLAN-COMPUTED": "a batch entry's computed_tokens disagrees with the tokens already computed",
    "DETERMINISM": "two runs on the same inputs made different decisions",
    "REF-DIVERGENCE": "the scheduler claims a reference policy but decided differently from the reference model",
}


@attrs.frozen
class Finding:
    """One violation, as data.

    Attributes:
        invariant: an invariant id (KV-CAP, NO-LOSS, ...) or a :data:`PROTOCOL` id.
        step_index: the step where it shows (None: the whole run).
        message: one sentence saying what happened, with the numbers.
        tenant, request_id: whose, when one tenant or request is to blame.
        observed, allowed: the observed value and the bound or expected value.
        call: the call into the scheduler that produced it (``plan_step``, ...).
    """

    invariant: str
    step_index: int | None
    message: str
    tenant: str | None = None
    request_id: int | None = None
    observed: Any = None
    allowed: Any = None
    call: str | None = None

    @property
    def protocol(self) -> bool:
        """True for a harness-level (protocol) finding."""
        return self.invariant in PROTOCOL

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able form (values that are not JSON become their repr)."""
        d = attrs.asdict(self)
        for k in ("observed", "allowed"):
            v = d[k]
            if not isinstance(v, (int, float, str, bool, type(None), list, dict)):
                d[k] = repr(v) if not isinstance(v, tuple) else list(v)
        return d

    def render(self) -> str:
        """One line: ``INVARIANT step k [tenant t] [request r] [call c]: message``."""
        parts = [self.invariant]
        if self.step_index is not None:
            parts.append(f"step {self.step_index}")
        if self.tenant is not None:
            parts.append(f"tenant {self.tenant}")
        if self.request_id is not None:
            parts.append(f"request {self.request_id}")
        if self.call is not None:
            parts.append(f"call {self.call}")
        return " ".join(parts) + ": " + self.message


def from_catalog(obj: Any) -> Finding:
    """A finding of the invariant catalog (any object with ``invariant``/``id``,
    ``step``/``step_index``, ``message`` ... attributes) as a :class:`Finding`."""
    if isinstance(obj, Finding):
        return obj
    get = lambda *names: next((getattr(obj, n) for n in names if getattr(obj, n, None) is not None), None)
    inv = get("invariant", "invariant_id", "id") or "UNKNOWN"
    msg = get("message", "sentence", "text")
    if msg is None:
        render = getattr(obj, "render", None) or getattr(obj, "describe", None)
        msg = render() if callable(render) else str(obj)
    req = get("request_id", "request", "requests")
    if isinstance(req, (list, tuple)):
        req = req[-1] if req else None  # the newest: e.g. the one a full queue should have refused
    tenant = get("tenant")
    if tenant is None:
        ts = get("tenants")
        tenant = ts[0] if isinstance(ts, (list, tuple)) and ts else None
    return Finding(
        invariant=str(inv), step_index=get("step_index", "step"), message=str(msg),
        tenant=tenant, request_id=req, observed=get("observed"), allowed=get("allowed"),
    )
