"""``python -m jupyter_remote_compute.cli``: the CLI, as ``jupyter remote-compute`` runs it."""

import sys

from . import main

sys.exit(main())
