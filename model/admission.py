"""Phase 2 of the step, the arrivals (SPEC.md 4.2 and 5).

:class:`AdmissionPhase` is a part of :class:`tenantry.model.step.Step` (which
inherits it): each arriving request is queued at its tenant, or refused with a
reason and a retry-after (a 429): too long, too large for the pool or its tenant's
KV cap, the request-rate or token bucket, the queue bound, a KV watermark, the
estimated wait.  It works on the step's scratch state and is not used alone; a
variant of the model overrides its methods on a subclass of ``Step``.
"""

from __future__ import annotations

import math

from .config import Config
from .events import Event
from .state import Sequence, TenantState, prefix_keys
from .workload import Request


def queued_blocks(cfg: Config, tenants: list[TenantState], tier: int) -> int:
    """KV blocks (``blocks_for(prompt + output)`` each) of the never-scheduled requests
    queued by tenants of tiers 0..``tier``: the queued work a ``kv_watermark_queued``
    watermark counts (SPEC.md 4.2; the seeds' gateway lab counts the same)."""
    return sum(cfg.blocks_for(q.request.total_tokens)
               for tc, t in zip(cfg.tenants, tenants) if tc.tier <= tier
               for q in t.queue if q.never_scheduled)


def estimated_wait_s(cfg: Config, tenants: list[TenantState], tier: int) -> float:
    """Estimated queue wait (seconds) of a tier-``tier`` arrival: the service tokens
    (``w_in`` x prompt + ``w_out`` x output, output = the request's max tokens) of the
    never-scheduled requests queued by that tier's tenants, over
    ``admission.wait_service_rate_tokens_per_s`` (SPEC.md 4.2)."""
    o = cfg.order
    pending = sum(o.w_in * q.request.prompt_tokens + o.w_out * q.request.output_tokens
                  for tc, t in zip(cfg.tenants, tenants) if tc.tier == tier
                  for q in t.queue if q.never_scheduled)
    return pending / cfg.admission.wait_service_rate_tokens_per_s


class AdmissionPhase:
    """The arrivals phase of :class:`~tenantry.model.step.Step`."""

    # --- 2. arrivals ------------------------------------------------------------

    def arrive(self, r: Request) -> None:
        """Request r arrives: it is queued, or refused with a reason (a 429)."""
        cfg, adm = self.cfg, self.cfg.admission
        i = cfg.tenant_index(r.tenant)
        tc = cfg.tenants[i]
        t_s = r.arrival_s
        if r.total_tokens > cfg.max_context_tokens:
            return self._reject(r, i, "too_long", None, t_s)
        need = cfg.blocks_for(r.total_tokens)
        cap = self._cap(i)
        if need > cfg.num_blocks or (cap is not None and need > cap):
            return self._reject(r, i, "too_large", None, t_s)
        t = self._refill(i)
        limited = adm.request_rate_limit and tc.request_rate_per_s is not None
        if limited and t.bucket_requests < 1.0:
            return self._reject(r, i, "rate_limit", (1.0 - t.bucket_requests) / tc.request_rate_per_s, t_s)
        bucket = adm.token_bucket and tc.token_rate_per_s is not None
        charge = r.prompt_tokens
        if adm.prompt_estimate == "bytes":
            nbytes = r.prompt_bytes if r.prompt_bytes is not None else 4 * r.prompt_tokens
            charge = math.ceil(nbytes / adm.bytes_per_token)
        taken = charge + self._reserved_output(i, r.output_tokens)  # what the bucket gives at admission
        if bucket:
            if taken > tc.token_burst_tokens:
                return self._reject(r, i, "token_bucket", None, t_s)
            if t.bucket_tokens < taken:
                return self._reject(r, i, "token_bucket", (taken - t.bucket_tokens) / tc.token_rate_per_s, t_s)
        if adm.queue_bound and tc.queue_bound is not None and t.fresh_queued >= tc.queue_bound:
            return self._reject(r, i, "queue_full", self.st.last_step_s * max(1, t.fresh_queued), t_s)
        if adm.kv_watermarks:
            wm = adm.kv_watermarks[min(tc.tier, len(adm.kv_watermarks) - 1)]
            if adm.kv_watermark_queued:
                if self.used + self._queued_blocks(tc.tier) + need > wm * cfg.num_blocks:
                    return self._reject(r, i, "kv_watermark", self.st.last_step_s, t_s)
            elif self.used >= wm * cfg.num_blocks:
                return self._reject(r, i, "kv_watermark", self.st.last_step_s, t_s)
        if adm.wait_limits_s:
            limit = adm.wait_limits_s[min(tc.tier, len(adm.wait_limits_s) - 1)]
            wait = self._estimated_wait_s(tc.tier)
            if wait > limit:
                return self._reject(r, i, "estimated_wait", wait - limit, t_s)
        salt = None if cfg.prefix_cache == "shared" else tc.salt
        keys = self._prefix_keys(r, salt) if cfg.prefix_cache != "off" else ()
        seq = Sequence(request=r, tenant=i, arrival_seq=self.next_seq, admitted_step=self.k,
                       prefix_keys=keys, ready_step=self.k, charged_prompt_tokens=charge if bucket else 0)
        self.next_seq += 1
        was_empty = not t.queue
        changes = {"queue": t.queue + (seq,), "fresh_queued": t.fresh_queued + 1}
        if limited:
            changes["bucket_requests"] = t.bucket_requests - 1.0
        if bucket:
            changes["bucket_tokens"] = t.bucket_tokens - taken
        self._set(i, **changes)
        self.events.append(Event("queued", r.request_id, i, t_s))
        if was_empty:
            self._on_backlogged(i)

    def _queued_blocks(self, tier: int) -> int:
        """:func:`queued_blocks` of this step's state (a method, so a mutant can replace it)."""
        return queued_blocks(self.cfg, self.tenants, tier)

    def _estimated_wait_s(self, tier: int) -> float:
        """:func:`estimated_wait_s` of this step's state (a method, so a mutant can replace it)."""
        return estimated_wait_s(self.cfg, self.tenants, tier)

    def _prefix_keys(self, r: Request, salt: str | None) -> tuple[int, ...]:
        """Prefix-cache keys of r's cacheable blocks under ``salt`` (:func:`~tenantry.model.state.prefix_keys`)."""
        return prefix_keys(self.cfg, r, salt)

    def _reject(self, r: Request, i: int, reason: str, retry_after_s: float | None, t_s: float) -> None:
        """Request r (of tenant i) is refused at admission: a ``rejected`` event with the
        reason and the retry-after (seconds, or None), at ``t_s`` (its arrival)."""
        self.events.append(Event("rejected", r.request_id, i, t_s, reason=reason, retry_after_s=retry_after_s))
