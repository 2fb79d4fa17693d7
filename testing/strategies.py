"""Hypothesis strategies for the invariant suite: workloads shaped to stress a
configuration, from tiny requests to ones larger than the pool.

``workloads(config, **shape)`` draws a :class:`~tenantry.model.workload.Workload`:
requests with ids 0..n-1 in arrival order, some cancelled by their client
(``cancel_s``) when asked, as :func:`tenantry.spec.invariants_run.run_checked`
takes it.
"""

from __future__ import annotations

from hypothesis import strategies as st

from tenantry.model.config import Config
import attrs

from tenantry.model.workload import Request, Workload


@st.composite
def workloads(draw, config: Config, *, max_requests: int = 20, idle_gaps: bool = False, long_outputs: bool = False,
              big: bool = False, shared_prefixes: bool = False, bursty: bool = False, cancels: bool = False,
              step_s: float = 0.01):
    """Draw a workload for ``config``.

    Shape switches: ``idle_gaps`` (quiet periods of 100 steps), ``long_outputs``
    (up to 60 output tokens), ``big`` (prompts up to the context limit, so the
    pool binds), ``shared_prefixes`` (prefix content ids from a 2-letter
    alphabet, so prompts share blocks), ``bursty`` (many arrivals at once),
    ``cancels`` (clients cancel some requests); ``step_s`` is the step length
    the gaps are measured in.
    """
    names = [t.name for t in config.tenants]
    ctx = config.max_context_tokens
    n = draw(st.integers(1, max_requests))
    gaps = (0.0, 0.0, 0.0, step_s) if bursty else (0.0, step_s, 3 * step_s, 10 * step_s)
    out_max = min(60 if long_outputs else 8, ctx - 1)
    t = 0.0
    reqs = []
    for rid in range(n):
        gap = gaps[draw(_index4)]
        if idle_gaps and draw(_index6) == 5:
            gap = 100 * step_s
        t = round(t + gap, 6)
        output = draw(st.integers(1, out_max))
        room = ctx - output
        kind = draw(_index6)
        if kind < 4:
            prompt = min((1, 16, 17, 32)[kind], room)
        else:
            prompt = draw(st.integers(1, room if big else min(64, room)))
        prefix = ()
        if shared_prefixes:
            prefix = tuple(draw(_bit) for _ in range(prompt // 16))
        reqs.append(Request(rid, names[draw(st.integers(0, len(names) - 1))], t, prompt, output, prefix_ids=prefix))
    if cancels:
        for rid in draw(st.lists(st.integers(0, n - 1), max_size=max(1, n // 3), unique=True)):
            delay = (0.0, step_s, 2 * step_s, 5 * step_s)[draw(_index4)]
            reqs[rid] = attrs.evolve(reqs[rid], cancel_s=round(reqs[rid].arrival_s + delay, 6))
    return Workload(tuple(reqs))


_index4 = st.integers(0, 3)
_index6 = st.integers(0, 5)
_bit = st.integers(0, 1)
