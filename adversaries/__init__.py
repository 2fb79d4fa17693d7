"""Abusive tenants: what one does to the other tenants under each policy, with evidence that replays.

Modules (import what you need; nothing heavy is imported here):

* :mod:`~tenantry.runner.setups`: the built-in policy setups (``SETUPS``, ``build_config``).
* :mod:`~tenantry.adversaries.victims`: honest traffic from the Azure 2023 traces.
* :mod:`~tenantry.adversaries.patterns`: the abusive patterns (``PATTERNS``, ``make_scenario``).
* :mod:`~tenantry.adversaries.objectives`: metrics of harm (``OBJECTIVES``, ``all_metrics``).
* :mod:`~tenantry.adversaries.evaluate`: one evaluation (``Task``, ``evaluate``) and executors.
* :mod:`~tenantry.adversaries.search`: random, evolutionary, Hypothesis and Z3 searches (``run_search``).
* :mod:`~tenantry.adversaries.z3search`: the Z3 search's abstract model.
* :mod:`~tenantry.testing.shrink`: delta debugging of a worst workload (``shrink``).
* :mod:`~tenantry.adversaries.report`: workload files, plots, the markdown report.
* :mod:`~tenantry.adversaries.check`: the matrix (``run_check``, ``run_cell``); ``command``: ``tenantry check``.
"""
