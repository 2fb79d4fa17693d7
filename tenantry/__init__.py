"""tenantry: a formally checked reference model of a multi-tenant LLM inference
scheduler, its invariants, Z3 proofs and adversarial workloads.

This package is the public face: what a user imports to write an adapter for
their own scheduler, a property test, or a check of a recorded history comes
from here, and stays here across releases (``tests/test_public_api.py`` pins
the list).  Everything else is reachable under the packages of the tree
(docs/layout.md), which may move.

    from tenantry import Claims, Config, Plan, Scheduled, StepResults, TenantConfig   # an adapter
    from tenantry import Request, Workload, simulate, check_history, Finding          # a property test
    from tenantry import strategies                                                   # Hypothesis strategies

Names are imported on first use (PEP 562), so ``import tenantry`` costs nothing
and importing one part does not import the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it (a module itself where the name is a module).
_EXPORTS: dict[str, str] = {
    # the adapter protocol (docs/adapter.md)
    "SchedulerAdapter": "tenantry.verify.protocol",
    "Claims": "tenantry.verify.protocol",
    "Plan": "tenantry.verify.protocol",
    "Scheduled": "tenantry.verify.protocol",
    "Rejection": "tenantry.verify.protocol",
    "StepResults": "tenantry.verify.protocol",
    "PlanError": "tenantry.verify.protocol",
    "CLAIMABLE": "tenantry.verify.protocol",
    "PROTOCOL": "tenantry.verify.protocol",
    # the model's configuration and inputs (SPEC.md 2 and 4.1)
    "Config": "tenantry.model.config",
    "TenantConfig": "tenantry.model.config",
    "OrderConfig": "tenantry.model.config",
    "AdmissionConfig": "tenantry.model.config",
    "EvictionConfig": "tenantry.model.config",
    "CostConfig": "tenantry.model.config",
    "ConfigError": "tenantry.model.config",
    "FleetConfig": "tenantry.model.routers",
    "Request": "tenantry.model.workload",
    "Workload": "tenantry.model.workload",
    "REJECT_REASONS": "tenantry.model.events",
    # running the model and its records (SPEC.md 5 and 6)
    "simulate": "tenantry.runner.simulate",
    "History": "tenantry.runner.history",
    "RequestRecord": "tenantry.runner.history",
    "StepRecord": "tenantry.runner.history",
    "read_history": "tenantry.runner.history",
    "write_history": "tenantry.runner.history",
    "read_workload_jsonl": "tenantry.runner.traces",
    "write_workload_jsonl": "tenantry.runner.traces",
    # the invariant catalog (SPEC.md 7)
    "Finding": "tenantry.spec.invariants",
    "INVARIANTS": "tenantry.spec.invariants",
    "check_state": "tenantry.spec.invariants",
    "check_history": "tenantry.spec.invariants",
    "coverage": "tenantry.spec.invariants",
    # checking a scheduler (SPEC.md 9)
    "verify_workload": "tenantry.verify.run",
    "verify_history": "tenantry.verify.offline",
    "Recording": "tenantry.verify.offline",
    "run_check": "tenantry.adversaries.check",
    # property testing
    "strategies": "tenantry.testing.strategies",
}
_MODULES = frozenset({"strategies"})

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import a public name on first use.

    Raises:
        AttributeError: for a name that is not public.
    """
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'tenantry' has no attribute {name!r}")
    module = importlib.import_module(where)
    value = module if name in _MODULES else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from tenantry.adversaries.check import run_check
    from tenantry.model.config import (
        AdmissionConfig, Config, ConfigError, CostConfig, EvictionConfig, OrderConfig, TenantConfig,
    )
    from tenantry.model.events import REJECT_REASONS
    from tenantry.model.routers import FleetConfig
    from tenantry.model.workload import Request, Workload
    from tenantry.runner.history import History, RequestRecord, StepRecord, read_history, write_history
    from tenantry.runner.simulate import simulate
    from tenantry.runner.traces import read_workload_jsonl, write_workload_jsonl
    from tenantry.spec.invariants import INVARIANTS, Finding, check_history, check_state, coverage
    from tenantry.testing import strategies
    from tenantry.verify.offline import Recording, verify_history
    from tenantry.verify.protocol import (
        CLAIMABLE, PROTOCOL, Claims, Plan, PlanError, Rejection, SchedulerAdapter, Scheduled, StepResults,
    )
    from tenantry.verify.run import verify_workload
