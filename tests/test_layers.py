"""The packages import one way (SPEC.md 10), and one way only.

Every ``import`` of the project's source (module level or inside a function)
is read with :mod:`ast`.  A package may import only the packages below it in
:data:`LAYERS`; imports between packages are absolute (``tenantry.<pkg>``),
imports within a package relative (``from .x import``).  Old import paths
that moved resolve at run time through ``tenantry._moved`` (one table), which
no package imports statically except the root's ``__init__``.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Bottom to top: each package may import those before it.
LAYERS = ("model", "spec", "testing", "proofs", "adversaries", "verify", "live", "commands", "cli")


def _packages() -> dict[str, Path]:
    """Layer name -> folder, from pyproject's package-dir (the root package is ``cli``)."""
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    out = {}
    for mod, d in dirs.items():
        parts = mod.split(".")
        out[parts[1] if len(parts) == 2 else "cli"] = ROOT / d
    return out


def _imports(pkg: str, folder: Path):
    """(file, line, imported module or None, relative level) for every import in ``pkg``'s own files."""
    for f in sorted(folder.glob("*.py")):
        tree = ast.parse(f.read_text(), str(f))
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                for a in n.names:
                    yield f, n.lineno, a.name, 0
            elif isinstance(n, ast.ImportFrom):
                yield f, n.lineno, n.module, n.level


def _target(module: str | None) -> str | None:
    if not module or not module.startswith("tenantry"):
        return None
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "cli"


def test_every_package_is_in_the_layer_table():
    assert set(_packages()) == set(LAYERS)


def test_packages_import_only_the_layers_below_them():
    bad = []
    for pkg, folder in _packages().items():
        below = set(LAYERS[:LAYERS.index(pkg)])
        for f, line, module, level in _imports(pkg, folder):
            tgt = _target(module) if level == 0 else None
            if tgt is None or tgt == pkg:
                continue
            if tgt == "cli" and module in ("tenantry", "tenantry._moved") and f.name == "__init__.py":
                continue
            if tgt not in below:
                bad.append(f"{f.relative_to(ROOT)}:{line}: {pkg} imports {module} ({tgt} is not below {pkg})")
    assert not bad, "\n".join(bad)


def test_imports_between_packages_are_absolute_and_within_a_package_relative():
    bad = []
    for pkg, folder in _packages().items():
        for f, line, module, level in _imports(pkg, folder):
            if level >= 2:
                bad.append(f"{f.relative_to(ROOT)}:{line}: relative import reaching out of {pkg}")
            elif level == 0 and _target(module) == pkg and pkg != "cli":
                bad.append(f"{f.relative_to(ROOT)}:{line}: {module} is in {pkg}: import it relatively")
            elif level == 0 and module and module.split(".")[0] in set(LAYERS) - {"cli"}:
                bad.append(f"{f.relative_to(ROOT)}:{line}: bare {module}: write tenantry.{module}")
    assert not bad, "\n".join(bad)


def test_moved_paths_are_aliases_with_a_warning():
    import importlib
    import sys
    import warnings

    from tenantry._moved import MOVED

    for old, new in MOVED.items():
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            mod = importlib.import_module(old)
        assert mod is importlib.import_module(new), old
        assert any(issubclass(x.category, DeprecationWarning) and new in str(x.message) for x in w), old
