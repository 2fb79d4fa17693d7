"""Test machinery, in one place: Hypothesis strategies
(:mod:`~tenantry.testing.strategies`), the stateful machine
(:mod:`~tenantry.testing.stateful`), the mutants of the model and their hunt
(:mod:`~tenantry.testing.mutants`, :mod:`~tenantry.testing.hunt`) and the one
shrinker (:mod:`~tenantry.testing.shrink`).  Nothing heavy is imported here.
"""
