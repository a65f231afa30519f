"""Who may do what with the organization's machines: JupyterHub custom scopes, granted through roles.

``use`` lets a user see the organization's machines and run jobs on them; ``admin`` adds, edits and
removes them and sees every user's jobs and usage. ``admin`` holds ``use`` as a subscope, so a role
that grants ``admin`` needs nothing else. The hub's configuration declares both
(``c.JupyterHub.custom_scopes = custom_scopes()``); ``README.md`` shows a whole configuration.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

USE = "custom:remote-compute:use"
ADMIN = "custom:remote-compute:admin"


def custom_scopes() -> dict[str, dict[str, Any]]:
    """What ``c.JupyterHub.custom_scopes`` needs for this service."""
    return {
        USE: {"description": "See the organization's machines and run jobs on them."},
        ADMIN: {
            "description": "Set the organization's machines and see every user's jobs and usage.",
            "subscopes": [USE],
        },
    }


def grants(scopes: Collection[str], scope: str) -> bool:
    """Whether ``scopes`` (a token's, as the hub resolved them) hold ``scope``; ``admin`` holds ``use``."""
    return scope in scopes or (scope == USE and ADMIN in scopes)
