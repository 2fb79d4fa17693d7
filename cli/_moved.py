"""Import paths that moved, and the thin aliases that keep the old ones working.

One table, :data:`MOVED`: old module name -> new module name.  Importing an old
name gives the new module itself (the same object, so ``isinstance`` and
monkeypatching behave) and a :class:`DeprecationWarning` naming the new path.
The aliases resolve at run time through a meta-path finder installed when
:mod:`tenantry` is imported, so no package imports a layer above it
(SPEC.md 9, "Layers").
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: Old module name -> new module name (the re-cut of 2026-11: checking third-party
#: schedulers left ``tenantry.spec`` for ``tenantry.verify``, test machinery went to
#: ``tenantry.testing``, commands to ``tenantry.commands``).
MOVED: dict[str, str] = {
    "tenantry.args": "tenantry.commands.args",
    "tenantry.model.command": "tenantry.commands.simulate",
    "tenantry.adversaries.command": "tenantry.commands.check",
    "tenantry.adversaries.flags": "tenantry.commands.args",
    "tenantry.adversaries.shrink": "tenantry.testing.shrink",
    "tenantry.adversaries.configs": "tenantry.model.setups",
    "tenantry.proofs.command": "tenantry.commands.prove",
    "tenantry.spec.command": "tenantry.commands.verify",
    "tenantry.spec.adapter": "tenantry.verify.protocol",
    "tenantry.spec.adapter_calls": "tenantry.verify.calls",
    "tenantry.spec.adapter_driver": "tenantry.verify.harness",
    "tenantry.spec.adapter_checks": "tenantry.verify.harness",
    "tenantry.spec.adapter_findings": "tenantry.verify.protocol",
    "tenantry.spec.adapter_reference": "tenantry.verify.reference",
    "tenantry.spec.adapter_vllm": "tenantry.verify.vllm",
    "tenantry.spec.vllm_adapter": "tenantry.verify.vllm",
    "tenantry.spec.pytest_plugin": "tenantry.verify.plugin",
    "tenantry.spec.verify_history": "tenantry.verify.offline",
    "tenantry.spec.verify_matrix": "tenantry.verify.run",
    "tenantry.verify.matrix": "tenantry.verify.run",
    "tenantry.spec.verify_run": "tenantry.verify.run",
    "tenantry.spec.verify_suite": "tenantry.verify.suite",
    "tenantry.spec.mutants": "tenantry.testing.mutants",
    "tenantry.spec.mutants_hunt": "tenantry.testing.hunt",
    "tenantry.spec.invariants_strategies": "tenantry.testing.strategies",
}


class _Aliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names of :data:`MOVED` and loads them as the new modules."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):  # noqa: D102
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old import path is a deprecated alias",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module) -> None:  # noqa: D102
        return None


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Aliases) for f in sys.meta_path):
        sys.meta_path.insert(0, _Aliases())
