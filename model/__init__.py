"""The reference model, exactly what SPEC.md specifies: configuration
(``config``), the requests offered (``workload``), the state (``state``), what
happens to a request (``events``), policies as small pure functions
(``policies``), a fleet's configuration and routers (``routers``), and the pure
step (``step``) with its phases (``running``, ``waiting``).  SPEC.md sections
2 to 5.  What runs it and records it is :mod:`tenantry.runner`.
"""
