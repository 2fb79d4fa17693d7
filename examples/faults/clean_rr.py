"""Clean: a per-tenant round robin with honest claims (must come out with no finding).

One request per tenant per turn; FIFO within a tenant; a per-tenant queue
bound, request-rate limit and eviction bound with a cooldown.  Claims
WORK-CONSERVING, FCFS-TENANT, EVICT-PROGRESS and REQUEST-RATE; the config
implies EVICT-BOUNDED and EVICT-COOLDOWN, and the safety invariants
(QUEUE-BOUND, REFUSAL-TRUTH, ...) are always checked.
"""

from .base import Scheduler, Setup, factory

SETUP = Setup(policy="round_robin", queue_bound=64, request_rate=(40.0, 40.0), max_evictions=3, cooldown_steps=1,
              invariants=("WORK-CONSERVING", "FCFS-TENANT", "EVICT-PROGRESS", "REQUEST-RATE"),
              describe="round robin over tenants (clean)")

make_scheduler = factory(Scheduler, SETUP)
