"""`python -m vigil.plugin`: the same as the console script `kubectl-vigil`."""

import sys

from vigil.plugin.cli import main

sys.exit(main())
