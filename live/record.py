"""What a live replay saw, as a tenantry history (SPEC.md 6 and 12.2).

A :class:`Seen` per request holds only what its history record needs (times, counts, the
refusal's status and body); :func:`live_history` turns a replay's into a
:class:`~tenantry.runner.history.History` with no step records: its header marks it a live
recording (``live``: URL, time scale, the identity fields sent, ...) and gives its ``end_s``.
Times are workload seconds: wall seconds since the run's start (a monotonic clock) times the
time scale.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from tenantry.model.workload import Request
from tenantry.runner.history import History, RequestRecord

#: Longest refusal body or failure text kept in a record (characters).
DETAIL_CHARS = 2000


def _t(x: float | None) -> float | None:
    """A measured time as recorded: rounded to the microsecond (a measurement has no more)."""
    return None if x is None else round(max(x, 0.0), 6)


class Seen:
    """What the client saw of one request (mutable while the request is in flight).

    Attributes:
        sent_s, answered_s, first_token_s, finish_s: workload seconds, or None (answered_s:
            when the answer's status and headers came).
        tokens: output tokens received; token_times: when each arrived (None when the
            replay keeps no per-token times).
        outcome: ``finished``, ``rejected``, ``cancelled`` or ``unfinished``; reason and
            retry_after_s: a refusal's; http_status: the answer's status;
            failure: one of :data:`~tenantry.runner.history.FAILURES`; detail: a refusal's
            body or what went wrong.
    """

    __slots__ = ("sent_s", "answered_s", "first_token_s", "finish_s", "tokens", "token_times", "outcome", "reason",
                 "retry_after_s", "http_status", "failure", "detail")

    def __init__(self, token_times: bool = True) -> None:
        self.sent_s = self.answered_s = self.first_token_s = self.finish_s = None
        self.tokens = 0
        self.token_times: list[float] | None = [] if token_times else None
        self.outcome = "unfinished"
        self.reason = self.http_status = self.failure = self.detail = None
        self.retry_after_s = None

    @property
    def ended(self) -> bool:
        """The request ended (finished, refused, cancelled or failed): nothing more will come."""
        return self.outcome != "unfinished" or self.failure is not None

    def got(self, n: int, t_s: float) -> None:
        """``n`` output tokens arrived at ``t_s``."""
        if n <= 0:
            return
        if self.first_token_s is None:
            self.first_token_s = t_s
        self.tokens += n
        self.finish_s = t_s
        if self.token_times is not None:
            self.token_times.extend([_t(t_s)] * n)

    def fail(self, failure: str, detail: str) -> None:
        """The stream ended early: ``failure`` (one of FAILURES) and what happened."""
        if not self.ended:
            self.failure, self.detail = failure, detail[:DETAIL_CHARS]

    def record(self, r: Request) -> RequestRecord:
        """The history record of request ``r``."""
        finish = self.finish_s
        if self.outcome == "unfinished":
            finish = None  # an unfinished request has no finish (its last token is in token_times)
        return RequestRecord(
            request_id=r.request_id, tenant=r.tenant, arrival_s=r.arrival_s, prompt_tokens=r.prompt_tokens,
            output_tokens=r.output_tokens, outcome=self.outcome, reason=self.reason,
            retry_after_s=_t(self.retry_after_s), first_token_s=_t(self.first_token_s), finish_s=_t(finish),
            tokens_generated=self.tokens, prefix_ids=r.prefix_ids, sent_s=_t(self.sent_s),
            answered_s=_t(self.answered_s),
            token_times=tuple(self.token_times or ()), http_status=self.http_status, failure=self.failure,
            detail=self.detail,
        )


def live_history(requests: Iterable[Request], seen: Mapping[int, Seen], header: Mapping[str, Any]) -> History:
    """The history of a replay: one record per request in id order (a request never sent is
    ``unfinished`` with no ``sent_s``), no step records, ``header`` as given (it carries
    ``live`` and ``end_s``)."""
    recs = []
    for r in sorted(requests, key=lambda q: q.request_id):
        s = seen.get(r.request_id) or Seen(token_times=False)
        recs.append(s.record(r))
    return History(header=dict(header), steps=(), requests=tuple(recs))
