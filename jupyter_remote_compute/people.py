"""Who a person is, as a person reads it: a job's submitter (``mlflow.user``, MLflow's Created by), who
cancelled a job or a pipeline run.

Every face names people by these rules: the CLI, the magic and a pipeline's steps by whoever runs them
(``local_person``), the REST API by Jupyter's identity of the visitor (``login`` and ``shown``).
"""

from __future__ import annotations

import getpass
import os
import re
from typing import Any

#: The username jupyter_server gives a visitor it cannot name (``IdentityProvider.generate_anonymous_user``:
#: a uuid4's hex, its name and display name "Anonymous Io" and the like, new for every browser).
ANONYMOUS_ID = re.compile(r"[0-9a-f]{32}")


def local_person() -> str:
    """Whoever runs this process: the hub's user name on a JupyterHub (its servers may all run as one
    OS user), else the OS user."""
    return os.environ.get("JUPYTERHUB_USER") or getpass.getuser()


def _identified(user: Any) -> bool:
    username = getattr(user, "username", None) or ""
    return bool(username) and not ANONYMOUS_ID.fullmatch(username)


def login(user: Any) -> str:
    """The name a job is kept under (its submitter, ``mlflow.user``, usage per user) for Jupyter's
    identity ``user``: its username (on a hub, the hub's user name); an anonymous visitor (a token,
    JupyterLab alone) is whoever runs the server."""
    return user.username if _identified(user) else local_person()


def shown(user: Any) -> str:
    """How a person reads ``user`` in a sentence ("cancelled by …"): the identity provider's display
    name (its name, else its username, when it gives none); an anonymous visitor is whoever runs the
    server, not the random "Anonymous Io" JupyterLab invents for each browser."""
    if not _identified(user):
        return local_person()
    return getattr(user, "display_name", None) or getattr(user, "name", None) or user.username
