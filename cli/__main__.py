"""``python -m tenantry.cli``: the ``tenantry`` command."""

import sys

from .dispatch import main

sys.exit(main())
