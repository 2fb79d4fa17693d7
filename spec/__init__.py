"""The specification: SPEC.md, the history schema (history_schema.json) and the
invariant catalog: :mod:`~tenantry.spec.invariants` (the registry, ``check_state``,
``check_history``, ``check_pair``), one implementation per invariant in
``invariants_state`` / ``invariants_policy`` (state forms) and
``invariants_history`` / ``invariants_history_fair`` (history forms), the one ``Finding`` in
``invariants_core``, and :func:`~tenantry.spec.invariants_run.run_checked`.
"""
