"""The public face (tenantry/__init__.py) is pinned: what a user imports from ``tenantry`` is
exactly this list, every name resolves to the object the package below defines, and the old path
of the adapter protocol keeps working.  A change to the list is a change of the public API: it
shows here and in docs/adapter.md."""

from __future__ import annotations

import subprocess
import sys

import pytest

import tenantry

PUBLIC = [
    "AdmissionConfig", "CLAIMABLE", "Claims", "Config", "ConfigError", "CostConfig", "EvictionConfig", "Finding",
    "FleetConfig", "History", "INVARIANTS", "OrderConfig", "PROTOCOL", "Plan", "PlanError", "REJECT_REASONS",
    "Recording", "Rejection", "Request", "RequestRecord", "Scheduled", "SchedulerAdapter", "StepRecord",
    "StepResults", "TenantConfig", "Workload", "check_history", "check_state", "coverage", "read_history",
    "read_workload_jsonl", "run_check", "simulate", "strategies", "verify_history", "verify_workload",
    "write_history", "write_workload_jsonl",
]


def test_the_public_names_are_pinned():
    assert sorted(tenantry.__all__) == sorted(PUBLIC)


@pytest.mark.parametrize("name", PUBLIC)
def test_each_public_name_is_the_object_its_package_defines(name):
    import importlib

    where = tenantry._EXPORTS[name]
    module = importlib.import_module(where)
    assert getattr(tenantry, name) is (module if name == "strategies" else getattr(module, name))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Plann'"):
        tenantry.Plann  # noqa: B018


def test_importing_tenantry_imports_nothing_else():
    """The face is lazy: ``import tenantry`` loads none of the packages (the CLI's start-up and
    every ``import tenantry.model...`` pay nothing for the names)."""
    out = subprocess.run([sys.executable, "-c", "import sys, tenantry; print(sorted(m for m in sys.modules "
                          "if m.startswith('tenantry.')))"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_adapters_written_against_the_protocol_module_keep_working():
    from tenantry.verify.protocol import Claims, Plan, Scheduled, StepResults

    assert (Claims, Plan, Scheduled, StepResults) == (tenantry.Claims, tenantry.Plan, tenantry.Scheduled,
                                                      tenantry.StepResults)
