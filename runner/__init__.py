"""What runs the reference model: the driver loop (``simulate``), the fast replica
(``fast``), a fleet in lockstep (``fleet``), histories (``history``), workload
files and traces (``traces``, ``files``) and the named setups (``setups``).

The model itself (the state, the step, the policies) is :mod:`tenantry.model`;
this package feeds it and records what it did (SPEC.md 5.1, 5.3 and 6).
"""
