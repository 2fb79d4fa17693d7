"""The specification: SPEC.md, the history schema (history_schema.json) and the
invariant catalog: :mod:`~tenantry.spec.invariants` (the registry, ``check_state``,
``check_history``, ``check_pair``), one definition per invariant: the record forms in
``invariants_history`` / ``invariants_history_blocks`` / ``invariants_history_fair`` /
``invariants_history_evict`` / ``invariants_claims`` (over :mod:`~tenantry.spec.replay`),
the state forms derived from
them and the state-only parts in ``invariants_state`` / ``invariants_policy``, the one
``Finding`` in ``invariants_core``, and :func:`~tenantry.spec.invariants_run.run_checked`.
"""
