"""Fault (kind 12, bug log: LiteLLM #18730, output tokens not reserved in the token bucket).  Expect TOKEN-BUCKET.

Imitates the report: a per-tenant token limit (100 tokens per second, burst
400) checked on the prompt at admission; generated tokens are neither reserved
(max_tokens) at admission nor charged as they are produced, so a tenant whose
requests have short prompts and long outputs consumes far more than
burst + rate x window tokens.

A gap, not caught: tenantry's configuration has no "reserve the output
allowance" option, and the TOKEN-BUCKET history form bounds the admitted
*prompt* tokens only (REFUSAL-TRUTH replays the bucket with the produced
tokens but only judges refusals, and this scheduler refuses less, never
wrongly).  ``tests/test_faults.py`` measures the overshoot on the witness.
"""

from .base import Scheduler, Seq, Setup, factory


class PromptOnlyBucketScheduler(Scheduler):
    """Charges the token bucket with prompts only."""

    def charge_output(self, seq: Seq) -> None:
        self.charge(seq.tenant, self.setup.w_out)  # BUG: the token bucket is not charged


SETUP = Setup(policy="fcfs", token_rate=(100.0, 400.0), invariants=("WORK-CONSERVING", "TOKEN-BUCKET"),
              describe="FCFS, token bucket charged with prompts only")
make_scheduler = factory(PromptOnlyBucketScheduler, SETUP)
