"""The ``tenantry`` subcommands, one module each: argument parsing and printing only.

What a command runs lives in the package below it: ``simulate`` in
:mod:`tenantry.model`, ``check`` in :mod:`tenantry.adversaries`, ``prove`` in
:mod:`tenantry.proofs`, ``verify`` in :mod:`tenantry.verify`.  Shared
argument types: :mod:`tenantry.cli.commands.args`.
"""
