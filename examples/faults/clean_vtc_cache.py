"""Clean: VTC over tenants with a salted prefix cache and honest claims (must come out with no finding).

The least virtual token counter goes next (prompt tokens charged at the first
scheduling, generated tokens as produced, a tenant joining the backlog lifted
to the least backlogged counter); full prompt blocks are cached under keys
chained over the tenant's salt, so tenants never share KV.  Claims
WORK-CONSERVING, NO-BANKED-CREDIT and EVICT-PROGRESS, and SALT-ISOLATION
through the salted cache; the counters are reported in every plan.
"""

from .base import Scheduler, Setup, factory

SETUP = Setup(policy="vtc", prefix_cache="salted",
              invariants=("WORK-CONSERVING", "NO-BANKED-CREDIT", "EVICT-PROGRESS"),
              describe="VTC with a salted prefix cache (clean)")

make_scheduler = factory(Scheduler, SETUP)
