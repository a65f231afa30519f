"""The errors users see. Each carries a stable code and, where it applies, the setting at fault.

The server maps them to ``{code, message, field}`` JSON with a 4xx status,
the CLI prints the message and exits non-zero, the magic raises them. A
message names the file or setting and what to do, and never holds a secret.
"""

from __future__ import annotations

from typing import Any


class RemoteComputeError(Exception):
    code = "error"
    status = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def to_json(self) -> dict[str, Any]:
        data = {"code": self.code, "message": self.message}
        if self.field:
            data["field"] = self.field
        return data


class InvalidSettings(RemoteComputeError):
    """A setting of a machine or job is wrong; ``field`` names it."""

    code = "invalid"


class NotFound(RemoteComputeError):
    code = "not_found"
    status = 404


class Conflict(RemoteComputeError):
    """The request disagrees with the current state (a stale write, a job still running)."""

    code = "conflict"
    status = 409


class SecretInUse(Conflict):
    """A secret that a machine or an unfinished job still needs; ``details.used_by`` names them."""

    code = "secret_in_use"

    def __init__(self, name: str, used_by: list[str]) -> None:
        super().__init__(
            f"secret {name!r} is in use by {', '.join(used_by)}; change the machine or let the jobs end "
            "(or cancel them), then delete it",
            field="name",
        )
        self.used_by = used_by

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "details": {"used_by": self.used_by}}


class ConfigFileError(RemoteComputeError):
    """A workspace file (compute.yaml, policy.yaml) cannot be used as it stands."""

    code = "config_file"
    status = 422


class SecretStoreUnavailable(RemoteComputeError):
    code = "secret_store_unavailable"
    status = 503


class SecretInSettings(RemoteComputeError):
    """A setting holds what looks like a secret; the message never repeats the value."""

    code = "secret_in_settings"


class PolicyDenied(RemoteComputeError):
    code = "policy_denied"
    status = 403


class MachineError(RemoteComputeError):
    """A machine could not be reached or did not do what was asked; ``details`` says more (a host key)."""

    code = "machine_error"
    status = 502

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = details or {}

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), **({"details": self.details} if self.details else {})}


class MachineUnreachable(MachineError):
    """The machine did not answer (refused, timed out, no such host): ``reason`` says why.

    To a check or a trust this is an answer, not a failed request: the REST API gives it with 200.
    """

    code = "unreachable"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class NotTrained(RemoteComputeError):
    """A job is not (yet) trained: still running, failed, cancelled, lost or missing outputs.

    The one error every caller that needs a trained job raises (step, magic, CLI).
    """

    code = "not_trained"
    status = 409

    def __init__(self, message: str, *, job_id: str, state: str, reason: str | None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.state = state
        self.reason = reason


class Forbidden(RemoteComputeError):
    """The caller is known but lacks the permission (a JupyterHub scope) the action needs."""

    code = "forbidden"
    status = 403
