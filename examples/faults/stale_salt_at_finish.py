"""Fault (kind 6): the blocks a request completes in its last step are cached under another tenant's salt.  Expect SALT-ISOLATION.

Imitates: a salted prefix cache (as ``fp_cache_at_finish``, which also caches
the blocks a request completes in the step it finishes, correctly) whose
finish path was written later and reads the salt from a "current request"
field of the scheduler instead of from the request: the field still names the
tenant of the last request the cache saw (the batch entry before it), so a
finishing request's last blocks are registered under that tenant's salt.  A
later request of that tenant with the same prompt prefix gets a declared
cache hit on KV another tenant wrote.

The writer is seen only in the step it finishes: a request whose prefill ends
in its last step (one output token) never runs after a step with those
blocks, so a checker that reads block ids of running requests only never
sees who wrote them (the reader looks like their first writer).
"""

from dataclasses import replace

from .base import Scheduler, Seq, factory
from .clean_vtc_cache import SETUP
from .fp_cache_at_finish import CacheAtFinishScheduler


class StaleSaltScheduler(Scheduler):
    """Caches at finish, under the salt of the request the cache last looked at (BUG)."""

    cache_at_finish = True

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.current_tenant: str | None = None  # the tenant of the request the cache last keyed
        self.leaving: set[int] = set()

    def update(self, out, tokens, finished) -> None:
        self.leaving = set(finished)
        super().update(out, tokens, finished)
        self.leaving = set()

    def cache_keys(self, seq: Seq) -> list[tuple]:
        if seq.rid not in self.leaving or self.current_tenant is None:
            self.current_tenant = seq.tenant
        keys, key = [], ("salt", self.current_tenant)  # BUG: at finish, the last request's tenant, not seq's
        for j in range(min(len(seq.prefix_ids), seq.prompt // self.B)):
            key = (key, seq.prefix_ids[j])
            keys.append(key)
        return keys


make_scheduler = factory(StaleSaltScheduler,
                         replace(SETUP, describe="VTC, salted prefix cache, caching at finish under a stale salt"),
                         fixed=CacheAtFinishScheduler)
