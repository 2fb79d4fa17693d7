"""A correct scheduler that tenantry flags today (a false positive, kept to show it).

The clean VTC scheduler with a salted prefix cache (``clean_vtc_cache``), except
that the prompt blocks a request completes in the step it finishes are cached
too (as SGLang inserts a request's KV into its radix cache when the request
finishes).  Every hit is still under the reader's own salt and content.

What tenantry reports: SALT-ISOLATION, "request R (tenant conv) holds block X
at position j, written by request A (tenant adv) under another salt".  The
history records block ids only for the requests running after a step, so the
write of a request into a block in the step it finishes is not seen; the block
keeps its earlier writer (another tenant's request that held it before it was
freed), and a later same-salt cache hit on it reads as a cross-tenant one.
"""

from dataclasses import replace

from .base import Scheduler, factory
from .clean_vtc_cache import SETUP


class CacheAtFinishScheduler(Scheduler):
    """Caches a finishing request's last completed blocks as well (correct)."""

    cache_at_finish = True


make_scheduler = factory(CacheAtFinishScheduler,
                         replace(SETUP, describe="VTC with a salted prefix cache, caching at finish too (correct)"))
