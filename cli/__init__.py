"""tenantry: a formally checked reference model of a multi-tenant LLM inference
scheduler, its invariants, Z3 proofs and adversarial workloads.

Subpackages: :mod:`tenantry.model` (the reference model), :mod:`tenantry.spec`
(invariants, history checks, adapters), :mod:`tenantry.adversaries`
(abusive tenants and searches), :mod:`tenantry.proofs` (Z3).
"""

__version__ = "0.1.0"

from ._moved import install as _install_aliases

_install_aliases()
