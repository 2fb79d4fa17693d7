"""tenantry: a formally checked reference model of a multi-tenant LLM inference
scheduler, its invariants, Z3 proofs and adversarial workloads.

Packages, bottom to top (each imports only those before it; SPEC.md 10):

* :mod:`tenantry.model`: the reference model (config and setups, state, the
  step, policies, workloads and traces, histories, the driver loop);
* :mod:`tenantry.spec`: the specification: SPEC.md, the history schema and
  the invariant catalog (one implementation per invariant, one ``Finding``);
* :mod:`tenantry.testing`: test machinery: Hypothesis strategies, the
  stateful machine, the mutants and their hunt, the one shrinker;
* :mod:`tenantry.proofs`: Z3 proofs with refuted twins;
* :mod:`tenantry.adversaries`: abusive tenants, objectives, searches, the
  ``check`` matrix;
* :mod:`tenantry.verify`: checking a scheduler tenantry did not write: the
  adapter protocol, the harness, history mode, the pytest plugin, vLLM;
* :mod:`tenantry.commands` and :mod:`tenantry.cli`: the command line.
"""

__version__ = "0.1.0"

from ._moved import install as _install_aliases

_install_aliases()
