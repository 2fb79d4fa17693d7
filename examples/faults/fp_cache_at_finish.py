"""A correct scheduler that tenantry once flagged (a false positive, fixed; kept clean by the tests).

The clean VTC scheduler with a salted prefix cache (``clean_vtc_cache``), except
that the prompt blocks a request completes in the step it finishes are cached
too (as SGLang inserts a request's KV into its radix cache when the request
finishes).  Every hit is still under the reader's own salt and content.

What tenantry reported until the history carried the block ids of a request
in the step it finishes: SALT-ISOLATION, "request R (tenant b) holds block X
at position j, written by request A (tenant a) under another salt".  The
write of a request into a block in its last step was not seen, so the block
kept its earlier writer (another tenant's request that held it before it was
freed), and a later same-salt cache hit on it read as a cross-tenant one.
``stale_salt_at_finish`` is the fault that only those block ids show.
"""

from dataclasses import replace

from .base import Scheduler, factory
from .clean_vtc_cache import SETUP


class CacheAtFinishScheduler(Scheduler):
    """Caches a finishing request's last completed blocks as well (correct)."""

    cache_at_finish = True


make_scheduler = factory(CacheAtFinishScheduler,
                         replace(SETUP, describe="VTC with a salted prefix cache, caching at finish too (correct)"))
