"""Fault (kind 2, a boundary request): a prompt of token_budget + 1 tokens goes in whole.  Expect BATCH-LIMITS.

Imitates: an off-by-one in a fast path for a request entering an idle step
(nothing else computes tokens in it): its whole prompt is run in one step when
it "fits the budget".  The author reasons that the last prompt token is the
one the first output token is sampled from, so the prompt fits when all but
its last token do: ``remaining - 1 <= token_budget``.  A request of exactly
``token_budget + 1`` (257) tokens entering an idle step is scheduled whole,
and the step computes 257 tokens against a budget of 256.

Shows only on a request of exactly 257 tokens (prompt, or prompt plus
generated tokens when it resumes after a preemption) entering an empty step.
"""

from .base import Scheduler, Seq, Setup, factory


class OneShotPrefillScheduler(Scheduler):
    """Runs a prompt unchunked in an idle step when all but its last token fit the budget."""

    def first_chunk(self, seq: Seq, computed: int, budget: int) -> int:
        left = seq.target - computed
        if budget == self.setup.token_budget and left - 1 <= budget:  # BUG: should be left <= budget
            return left
        return super().first_chunk(seq, computed, budget)


SETUP = Setup(policy="fcfs", describe="FCFS, one-shot prefill off by one at the budget")
make_scheduler = factory(OneShotPrefillScheduler, SETUP)
