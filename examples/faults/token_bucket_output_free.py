"""Fault (kind 12, bug log: LiteLLM #18730, output tokens not reserved in the token bucket).  Expect TOKEN-LIMIT.

Imitates the report and a half-done fix: a per-tenant token limit (100 tokens
per second, burst 400) that claims to reserve each request's output
allowance at admission (``reserve_output``, so generated tokens are no longer
charged as they are produced), but whose admission still takes only the
prompt from the bucket.  A tenant whose requests have short prompts and long
outputs consumes far more than burst + rate x window tokens, prompt plus
output, which TOKEN-LIMIT bounds.  (Before the model had the reservation this
fault was listed as a gap: nothing could be claimed that it breaks.)
"""

from .base import Scheduler, Seq, Setup, factory


class PromptOnlyBucketScheduler(Scheduler):
    """Claims the output reservation, takes the prompt only."""

    def token_charge(self, seq: Seq) -> int:
        return seq.prompt  # BUG: the reservation of seq.max_tokens is forgotten


SETUP = Setup(policy="fcfs", token_rate=(100.0, 400.0), reserve_output=True,
              invariants=("WORK-CONSERVING", "TOKEN-BUCKET", "TOKEN-LIMIT"),
              describe="FCFS, token bucket that claims to reserve the output but takes the prompt only")
make_scheduler = factory(PromptOnlyBucketScheduler, SETUP)
