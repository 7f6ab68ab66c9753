"""`python -m vigil.worker [--slots N] -- CMD ARGS...`: as `vigil-worker`."""

import sys

from vigil.worker.runner import main

sys.exit(main())
