"""The folder tree is the package tree, and the packages import one way (docs/layout.md).

Every ``import`` of the project's source (module level or inside a function)
is read with :mod:`ast`.  A package may import only the packages below it in
:data:`LAYERS`; imports between packages are absolute (``tenantry.<pkg>``),
imports within a package relative (``from .x import``); and no package's
modules import each other in a cycle, not even through an import inside a
function.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Bottom to top: each package may import those before it.  ``tenantry`` (the public face,
#: tenantry/__init__.py) is the top: it names what the others define and imports them lazily.
LAYERS = ("model", "runner", "spec", "testing", "proofs", "adversaries", "studies", "verify", "engines", "live", "cli",
          "tenantry")


def _package_dirs() -> dict[str, Path]:
    """Dotted package -> folder, from pyproject's package-dir."""
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {mod: ROOT / d for mod, d in dirs.items()}


def _layer(module: str) -> str | None:
    """The layer of a dotted module name of the project (``tenantry.cli.commands.check`` -> ``cli``)."""
    if not module or module.split(".")[0] != "tenantry":
        return None
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "tenantry"


def _modules() -> dict[str, Path]:
    """Every source module's dotted name -> its file."""
    out = {}
    for pkg, folder in _package_dirs().items():
        for f in sorted(folder.glob("*.py")):
            out[pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"] = f
    return out


def _imports(name: str, f: Path):
    """(line, absolute module imported, level, names) for every import in module ``name``."""
    is_pkg = f.stem == "__init__"
    for n in ast.walk(ast.parse(f.read_text(), str(f))):
        if isinstance(n, ast.Import):
            for a in n.names:
                yield n.lineno, a.name, 0, ()
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (n.level - 1)]
                mod = ".".join(base + ([n.module] if n.module else []))
            else:
                mod = n.module or ""
            yield n.lineno, mod, n.level, tuple(a.name for a in n.names)


def test_the_folder_tree_is_the_package_tree():
    """Each folder maps to the package of its path: ``<folder>`` is ``tenantry.<folder>`` (a
    subfolder ``a/b`` is ``tenantry.a.b``), and the face ``tenantry/`` is ``tenantry``."""
    for pkg, folder in _package_dirs().items():
        rel = folder.relative_to(ROOT).as_posix()
        expected = "tenantry" if rel == "tenantry" else "tenantry." + rel.replace("/", ".")
        assert pkg == expected, (pkg, rel)
        assert (folder / "__init__.py").is_file(), folder


def test_every_package_is_in_the_layer_table():
    assert {_layer(p) for p in _package_dirs()} == set(LAYERS)


def test_packages_import_only_the_layers_below_them():
    bad = []
    for name, f in _modules().items():
        pkg = _layer(name)
        below = set(LAYERS[:LAYERS.index(pkg)])
        for line, module, level, _ in _imports(name, f):
            tgt = _layer(module)
            if tgt is None or tgt == pkg:
                continue
            if tgt not in below:
                bad.append(f"{f.relative_to(ROOT)}:{line}: {pkg} imports {module} ({tgt} is not below {pkg})")
    assert not bad, "\n".join(bad)


def test_imports_between_packages_are_absolute_and_within_a_package_relative():
    bad = []
    layers = set(LAYERS) - {"tenantry"}
    for name, f in _modules().items():
        pkg = name if f.stem == "__init__" else name.rsplit(".", 1)[0]
        for line, module, level, _ in _imports(name, f):
            if level >= 2:
                bad.append(f"{f.relative_to(ROOT)}:{line}: relative import reaching out of {pkg}")
            elif level == 0 and module.startswith(pkg + ".") and "." not in module[len(pkg) + 1:] \
                    and pkg != "tenantry":
                bad.append(f"{f.relative_to(ROOT)}:{line}: {module} is in {pkg}: import it relatively")
            elif level == 0 and module and module.split(".")[0] in layers:
                bad.append(f"{f.relative_to(ROOT)}:{line}: bare {module}: write tenantry.{module}")
    assert not bad, "\n".join(bad)


def _graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (at any depth of the file: in functions too)."""
    mods = _modules()
    g: dict[str, set[str]] = {m: set() for m in mods}
    for name, f in mods.items():
        if name == "tenantry":
            continue  # the face names everything; nothing imports it
        for _, module, _, names in _imports(name, f):
            subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in mods]  # ``from . import x``: submodule x
            g[name].update(subs)
            if module in mods and len(subs) < len(names or (None,)):
                g[name].add(module)
    return g


def _cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``g`` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(g[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(g):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_no_module_imports_itself_back_through_others():
    """No cycle among the modules, within a package or across (an import inside a function counts:
    hiding a cycle there is still a cycle)."""
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle():
    """The check is able to fail: a planted cycle through a function-level import is found."""
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _cycle(g) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
