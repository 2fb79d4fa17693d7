"""The ``tenantry`` command line: :func:`main` dispatches to one module per subcommand.

``tenantry.cli.dispatch`` holds the dispatcher and the signal handling;
:mod:`tenantry.cli.commands` holds the subcommands (flags and printing only:
what a command runs lives in the package below it, docs/layout.md).
"""

from .dispatch import main

__all__ = ["main"]
