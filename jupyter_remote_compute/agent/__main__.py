"""``python -m jupyter_remote_compute.agent``: the pull agent."""

import sys

from .client import main

sys.exit(main())
