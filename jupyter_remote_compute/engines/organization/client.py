"""The organization service as a user's server, kernel or CLI reaches it: with the hub token it holds.

Inside a server the hub spawned, ``JUPYTERHUB_API_TOKEN`` is that server's token (kernels and
terminals inherit it), so nothing needs setting up: the token says who the user is, and the hub's
roles say what they may do. The service is found at ``REMOTE_COMPUTE_ORG_URL`` when the hub's
configuration sets it for its servers (``c.Spawner.environment``), else asked of the hub by name
(``REMOTE_COMPUTE_ORG_SERVICE``, default ``remote-compute``). Outside a hub there is none, and each
user works alone as before.

Where an admin named one of the organization's machines the default, a job that names no machine runs
there (``job_machine``), as it runs on ``local`` everywhere else.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ...errors import Conflict, Forbidden, InvalidSettings, MachineError, NotFound
from ...people import local_person
from ...schema.machine import Machine

if TYPE_CHECKING:
    import requests  # imported where used: every face imports this module, and most never reach a hub

log = logging.getLogger(__name__)

DEFAULT_SERVICE = "remote-compute"
TIMEOUT = 10.0
#: A check connects to the machine from the service: as long as a check of one's own may take.
CHECK_TIMEOUT = 120.0
#: A job's machine that is the organization's: ``org:NAME``. Never a name of one's own (those have no ':').
ORG_PREFIX = "org:"
#: The kind of such a machine in a user's workspace: its engine (``engines/organization/engine.py``) asks the service.
ORG_KIND = "organization"
#: The service's errors, by their ``code``, raised here as the same errors (the field named stays named).
ERRORS = {cls.code: cls for cls in (InvalidSettings, Conflict, NotFound, Forbidden)}
#: A code of its own (``secret_in_use``, ``quota_exceeded``) is raised as the error of its status.
BY_STATUS = {400: InvalidSettings, 404: NotFound, 409: Conflict}
#: The options of an organization's machine its jobs take on the user's side, where their container
#: command is built: the default image and how containers run there. Not its ``registry_secret``: that
#: names an entry of the service's Secret Manager, which no user reads.
IMAGE_OPTIONS = (
    "image",
    "container_runtime",
    "container_network",
    "container_gpus",
    "pull_timeout",
    "image_max_age_days",
)


class OrganizationUnavailable(MachineError):
    """The organization service is configured but did not answer as it should."""


class OrganizationClient:
    def __init__(self, url: str, token: str) -> None:
        import requests

        self.url = url.rstrip("/") + "/"
        self._session = requests.Session()
        self._session.headers["Authorization"] = f"token {token}"

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> OrganizationClient | None:
        """The service of the hub that started this server, or None outside a hub or where it has none."""
        env = os.environ if environ is None else environ
        token = env.get("JUPYTERHUB_API_TOKEN")
        if not token:
            return None
        if env.get("REMOTE_COMPUTE_ORG_URL"):
            return cls(env["REMOTE_COMPUTE_ORG_URL"], token)
        api = env.get("JUPYTERHUB_API_URL")
        if not api:
            return None
        name = env.get("REMOTE_COMPUTE_ORG_SERVICE") or DEFAULT_SERVICE
        import requests

        try:
            answer = requests.get(
                f"{api.rstrip('/')}/services/{name}", headers={"Authorization": f"token {token}"}, timeout=TIMEOUT
            )
        except requests.RequestException:
            return None
        if answer.status_code != 200:
            return None  # no such service, or this token may not look it up: no organization here
        service = answer.json()
        if not service.get("url"):
            return None
        return cls(f"{service['url'].rstrip('/')}{service.get('prefix') or f'/services/{name}/'}", token)

    def me(self) -> dict[str, Any]:
        return self._ask("GET", "api/me")

    def machines(self) -> list[dict[str, Any]]:
        return list(self.listing()["machines"])

    def listing(self) -> dict[str, Any]:
        """The organization's machines and, apart from them, its default (or None)."""
        return dict(self._ask("GET", "api/machines"))

    def default_machine(self) -> dict[str, Any]:
        """``{machine: described or None, set_by}``."""
        return dict(self._ask("GET", "api/default-machine"))

    def set_default_machine(self, name: str) -> dict[str, Any]:
        return dict(self._ask("PUT", "api/default-machine", {"machine": name}))

    def clear_default_machine(self) -> None:
        self._ask("DELETE", "api/default-machine")

    def machine(self, name: str) -> dict[str, Any]:
        return self._ask("GET", f"api/machines/{name}")

    def tracking(self) -> dict[str, Any]:
        """``{uri: the organization's tracking server or None, set_by}``."""
        return dict(self._ask("GET", "api/tracking"))

    def set_tracking(self, uri: str) -> dict[str, Any]:
        return dict(self._ask("PUT", "api/tracking", {"uri": uri}))

    def clear_tracking(self) -> None:
        self._ask("DELETE", "api/tracking")

    def request(
        self, method: str, path: str, timeout: float | tuple[float, float] = TIMEOUT, **kw: Any
    ) -> requests.Response:
        """An answer of the service as it came (the organization engine reads its job routes so)."""
        import requests

        try:
            return self._session.request(method, self.url + path, timeout=timeout, allow_redirects=False, **kw)
        except requests.RequestException as e:
            raise OrganizationUnavailable(f"the organization service at {self.url} did not answer: {e}") from None

    def secrets(self) -> dict[str, Any]:
        """The service's own Secret Manager (admin): ``{store, secrets}``, names and places only."""
        return self._ask("GET", "api/secrets")

    def set_secret(self, name: str, value: str) -> dict[str, Any]:
        return self._ask("PUT", f"api/secrets/{quote(name, safe='')}", {"value": value})

    def remove_secret(self, name: str) -> None:
        self._ask("DELETE", f"api/secrets/{quote(name, safe='')}")

    def add_machine(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._ask("POST", "api/machines", body)

    def update_machine(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._ask("PATCH", f"api/machines/{name}", body)

    def remove_machine(self, name: str) -> None:
        self._ask("DELETE", f"api/machines/{name}")

    def check_machine(self, name: str) -> dict[str, Any]:
        """The machine's facts as the service reads them with the organization's credentials."""
        return self._ask("POST", f"api/machines/{name}/check", timeout=CHECK_TIMEOUT)

    def jobs(self, all_users: bool = False) -> list[dict[str, Any]]:
        """The caller's jobs on the organization's machines (``all_users``: everyone's, for an admin)."""
        return list(self._ask("GET", "api/jobs", params={"all_users": "1"} if all_users else None)["jobs"])

    def usage(self, params: Mapping[str, str]) -> dict[str, Any]:
        """The organization's ledger summed (``all_users``: everyone's, for an admin)."""
        return self._ask("GET", "api/usage", params=params)

    def quotas(self) -> list[dict[str, Any]]:
        return list(self._ask("GET", "api/quotas")["quotas"])

    def set_quota(self, who: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._ask("PUT", f"api/quotas/{who}/{name}", body)

    def remove_quota(self, who: str, name: str) -> None:
        self._ask("DELETE", f"api/quotas/{who}/{name}")

    def _ask(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        timeout: float = TIMEOUT,
    ) -> Any:
        import requests

        try:
            answer = self._session.request(
                method, self.url + path, json=body, params=params, timeout=timeout, allow_redirects=False
            )
        except requests.RequestException as e:
            raise OrganizationUnavailable(f"the organization service at {self.url} did not answer: {e}") from None
        if answer.status_code == 204:
            return None
        try:
            data = answer.json()
        except ValueError:
            data = None
        if answer.ok and data is not None:
            return data
        if isinstance(data, dict) and data.get("message") and 400 <= answer.status_code < 500:
            error = ERRORS.get(str(data.get("code"))) or BY_STATUS.get(answer.status_code, Forbidden)
            raise error(str(data["message"]), field=data.get("field"))
        message = data.get("message") if isinstance(data, dict) else None
        raise OrganizationUnavailable(
            f"the organization service at {self.url} answered {answer.status_code}: {message or answer.reason}"
        )


_found: OrganizationClient | None = None
_finding = threading.Lock()


def organization() -> OrganizationClient | None:
    """This process's organization service, found once (a hub without one is asked again next time)."""
    global _found
    with _finding:
        if _found is None:
            _found = OrganizationClient.from_environment()
        return _found


def shared_machine(name: str) -> Machine | None:
    """The organization's machine ``name`` (``org:NAME`` or NAME) as a job in this workspace names it:
    ``org:NAME``, of kind ``organization``; None where there is no organization or it has no such machine.
    A user without the use scope is refused (``Forbidden`` names the scope)."""
    client = organization()
    if client is None:
        return None
    plain = name.removeprefix(ORG_PREFIX)
    try:
        data = client.machine(plain)
    except NotFound:
        return None
    return Machine(
        name=ORG_PREFIX + plain,
        kind=ORG_KIND,
        address=str(data.get("address") or plain),
        enabled=bool(data.get("enabled", True)),
        created=data.get("created"),
        options={
            "machine": plain,
            "kind": str(data.get("kind")),
            **{k: v for k, v in (data.get("options") or {}).items() if k in IMAGE_OPTIONS},
        },
    )


def tracking_server() -> str | None:
    """The organization's MLflow tracking server, where the runs of jobs on its machines are recorded;
    None where there is no organization or its admins set none (each user's own store)."""
    client = organization()
    if client is None:
        return None
    return client.tracking().get("uri") or None


def with_organization(own: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """A face's machine list: the user's own machines (``owner``: the user) and then the organization's,
    with what the organization says of this user — or, when it could not be asked, why (the user's own
    machines are listed all the same). ``None``: no organization here.

    The organization's default machine is not among them: ``default`` names it (``org:NAME``), for the
    faces to preselect."""
    mine = [{**m, "owner": local_person()} for m in own]
    client = organization()
    if client is None:
        return mine, None
    try:
        me = client.me()
        listing = client.listing() if me.get("use") else {"machines": []}
    except (OrganizationUnavailable, Forbidden) as e:
        return mine, {"url": client.url, "problem": e.message}
    default = listing.get("default")
    return mine + list(listing["machines"]), {
        "url": client.url,
        **me,
        "default": ORG_PREFIX + default["name"] if default else None,
    }


def job_machine(given: str | None) -> str:
    """The machine of a job that names ``given`` (None or "": it names none): the organization's
    default (``org:NAME``) where an admin set one and the user may use it, else ``local``, as where
    there is no organization (a service that does not answer included: its user's work goes on)."""
    if given:
        return given
    client = organization()
    if client is None:
        return "local"
    try:
        default = client.default_machine().get("machine")
    except Forbidden:  # no use scope: the organization's machines are not this user's
        return "local"
    except OrganizationUnavailable as e:
        log.warning("no machine named: running on local, as %s", e.message)
        return "local"
    return ORG_PREFIX + str(default["name"]) if default else "local"
