"""The reference model: configuration and setups (``config``, ``setups``), the
state (``state``), the pure step (``step``), policies as small pure functions
(``policies``), workloads and trace files (``workload``, ``traces``),
histories (``history``) and the one driver loop (``simulate``).  SPEC.md
sections 2 to 6.
"""
