"""``python -m jupyter_remote_compute.agent``: the pull agent."""

import sys

from .command import main

sys.exit(main())
