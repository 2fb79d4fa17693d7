"""Z3 proofs of the scheduler invariants for any number of tenants (SPEC.md section 8).

Public surface::

    tenantry.proofs.registry.PROOFS            # every Proof, in run order
    tenantry.proofs.registry.select(ids)       # by id, id prefix or family
    tenantry.proofs.core.run_all(proofs)       # -> [Outcome]: proofs, twins, limits
    tenantry.proofs.core.run_proof / run_twin  # one at a time
    tenantry.proofs.tight.measure(T)           # the VTC gap a concrete workload reaches
    tenantry.proofs.concrete.build_state       # consistent concrete states for replays
    tenantry prove [IDS] [--json]              # the command (tenantry.cli.commands.prove)

One module per family: ``vtc``, ``drr``, ``priority`` (floors, aging),
``order`` (FCFS within a tenant and a tier, tier order), ``wait`` (bounded
wait under fcfs), ``bucket`` (token bucket, request rate), ``admission``
(truthful refusals), ``evict`` (hysteresis) and ``preempt`` (family
``evict``: minimal, progressing preemption), ``kv`` (pool, caps, salts).
"""
