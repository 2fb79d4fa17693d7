"""Fault (kind 6): a block written under one tenant's salt is handed to another.  Expect SALT-ISOLATION.

Imitates: a salted prefix cache (lookups and registrations are keyed by the
tenant's salt) with a memory-saving "dedupe" pass written later, which keys
blocks by their content alone: when a request completes a prompt block whose
content some cached block already holds, the request's copy is freed and the
cached block is put in its block table instead.  No cache hit is declared
(the request computed the block itself), but from then on it reads KV that
another tenant wrote: the salt's isolation is gone.

Shows when two tenants send the same prompt prefix (the prefix_probe pattern
guesses the conv victim's system prompts).
"""

from .base import Scheduler, Seq, Setup, factory


class DedupeScheduler(Scheduler):
    """Salted cache, plus a content-only dedupe of completed prompt blocks."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.by_content: dict[tuple, tuple[int, tuple]] = {}  # content ids -> (cached block, its cache key)

    def register_blocks(self, seq: Seq) -> None:
        keys = self.cache_keys(seq)
        done = min(seq.computed // self.B, len(keys))
        for j in range(seq.registered, done):
            content = tuple(seq.prefix_ids[: j + 1])  # BUG: the dedupe key leaves out the salt
            mine = seq.block_ids[j]
            other, key = self.by_content.get(content, (None, None))
            if other is not None and other != mine and self.pool.cache.get(key) == other:
                self.pool.lookup([key])      # one more reference to the cached copy ...
                self.pool.free([mine])       # ... and this request's own copy freed
                seq.block_ids[j] = other
                continue
            self.pool.register(keys[j], mine)
            if self.pool.cache.get(keys[j]) == mine:
                self.by_content[content] = (mine, keys[j])
        seq.registered = max(seq.registered, done)


SETUP = Setup(policy="vtc", prefix_cache="salted", invariants=("WORK-CONSERVING",),
              describe="VTC, salted prefix cache with a content-only dedupe")
make_scheduler = factory(DedupeScheduler, SETUP)
