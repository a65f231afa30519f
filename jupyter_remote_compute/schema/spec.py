"""What a job asks for: ``JobSpec``, with its ``Resources``, its ``Environment`` and the ``Image`` it runs in.

One definition each for every face (the panel, the magic, the CLI, a pipeline step), the state file
and the REST API. ``validate(JobSpec, data)`` (``JobSpec.from_json``) checks shape: types, names, and
that every path stays a plain workspace-relative path; whether the files exist (and stay inside the
workspace once symlinks are followed) is checked when they are read (``transfer/manifest.py``).
The classes are plain dataclasses: built in code or read back from the state file they are not
checked again (100,000 jobs are read at a server's start); pydantic reads them from JSON, writes
them back in the shape they were read in, and describes them to ``openapi.yaml``.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, Strict, with_config
from pydantic_core import core_schema

from ..secrets import resolve_reference
from . import values
from .base import STRICT, absent, problem, to_json, validate
from .environment import Environment, Image
from .notify import Webhook, webhooks
from .resources import NO_RESOURCES, Resources
from .retry import RetryPolicy

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KEY = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
#: The variables container.sh reads (and unsets) before an image's pull; never given to the container
#: (environments/image_registry.py).
REGISTRY_AUTH_VAR = "REMOTE_COMPUTE_REGISTRY_AUTH"
PULL_TIMEOUT_VAR = "REMOTE_COMPUTE_PULL_TIMEOUT"
IMAGE_MAX_AGE_VAR = "REMOTE_COMPUTE_IMAGE_MAX_AGE_DAYS"
PULL_VARS = frozenset({REGISTRY_AUTH_VAR, PULL_TIMEOUT_VAR, IMAGE_MAX_AGE_VAR})
#: Set by the launcher for every job; a spec may not override them.
#: Where the job finds its checkpoint folder (an absolute path on its machine), set by the launcher
#: from the job's ``checkpoints`` (jobs/checkpoints.py); and the variable that carries the name there.
CHECKPOINT_DIR_VAR = "REMOTE_COMPUTE_CHECKPOINT_DIR"
CHECKPOINTS_VAR = "REMOTE_COMPUTE_CHECKPOINTS"
#: Set on this side when the user's MLflow store is not a folder: the launcher then gives the job its
#: folder store under a scheme of its own (engines/launcher.JOB_ENV_SH).
STORE_SCHEME_VAR = "REMOTE_COMPUTE_STORE_SCHEME"
#: How often a running job's checkpoints come home when it does not say (seconds).
DEFAULT_CHECKPOINT_EVERY = 60.0
RESERVED_ENV = frozenset(
    {
        "MLFLOW_TRACKING_URI",
        "MLFLOW_REGISTRY_URI",
        "MLFLOW_ALLOW_FILE_STORE",
        "PYTHONUNBUFFERED",
        CHECKPOINT_DIR_VAR,
        CHECKPOINTS_VAR,
        STORE_SCHEME_VAR,
        *PULL_VARS,
    }
)


# -- the spec -----------------------------------------------------------------------------------------
def _machine(value: Any) -> Any:
    value = values.given_or("local")(value)
    if not isinstance(value, str):
        raise problem("expected a machine name")
    return value


def _command(value: Any) -> Any:
    if isinstance(value, str):
        if not value.strip():
            raise problem("cannot be empty")
    elif isinstance(value, (list, tuple)) and value and all(isinstance(a, str) for a in value):
        value = tuple(value)
    else:
        raise problem("expected a shell command or a list of arguments")
    if "\0" in (value if isinstance(value, str) else "".join(value)):
        raise problem("contains a NUL character")
    return value


def _env(value: Any) -> Any:
    value = values.given_or({})(value)
    if not isinstance(value, Mapping):
        raise problem("expected NAME → value pairs")
    for name, text in value.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise problem("not a valid environment variable name", at=name)
        if name in RESERVED_ENV:
            raise problem("is set by jupyter-remote-compute for every job", at=name)
        if not isinstance(text, str):
            raise problem("expected a string value", at=name)
        if "\0" in text:
            raise problem("contains a NUL character", at=name)
    return dict(value)


def _name(value: Any) -> Any:
    value = values.given_or("")(value)
    if not isinstance(value, str) or len(value) > 200 or any(ord(c) < 32 for c in value):
        raise problem("expected one line of at most 200 characters")
    return value


def _key(value: Any) -> Any:
    if value is not None and (not isinstance(value, str) or not _KEY.fullmatch(value)):
        raise problem("letters, digits and _ . : - only, at most 128")
    return value


def _fallback(value: Any) -> Any:
    return values.machine_names(values.given_or(())(value))


def _environment(value: Any) -> Any:
    return None if value is None or value == {} else value


_PATHS = BeforeValidator(values.path_list, json_schema_input_type=str | list[str] | None)
#: A path a spec names: checked like a path (a glob's fixed parts may not climb out either).
RelativePath = Annotated[str, BeforeValidator(values.relative_path, json_schema_input_type=str)]


@with_config(STRICT)
@dataclasses.dataclass(frozen=True, kw_only=True)
class JobSpec:
    machine: Annotated[
        str,
        BeforeValidator(_machine, json_schema_input_type=str | None),
        Field(
            description="the machine's name (`org:NAME`: the organization's); none given: `local`, or where a hub's "
            "organization has a default machine, that one (`POST /jobs`)"
        ),
    ] = "local"
    command: Annotated[
        str | tuple[str, ...],
        BeforeValidator(
            _command,
            json_schema_input_type=Annotated[str, Field(min_length=1)] | Annotated[list[str], Field(min_length=1)],
        ),
        Field(
            description="one line for the machine's shell (sh), run in the job's folder as written (`&&`, pipes "
            "and `$VARS` work); a list is the line's words, each quoted"
        ),
    ]
    send: Annotated[
        tuple[RelativePath, ...],
        _PATHS,
        Field(description="workspace-relative files, folders or globs (one as a string)"),
    ] = ()
    bring_back: Annotated[tuple[RelativePath, ...], _PATHS] = ()
    env: Annotated[
        dict[str, str],
        BeforeValidator(_env, json_schema_input_type=dict[str, str] | None),
        Field(description="NAME → value, or secret:NAME to pass a Secret Manager entry"),
    ] = dataclasses.field(default_factory=dict)
    # the longest the job may run on the far side
    timeout: Annotated[
        float | None,
        BeforeValidator(values.duration, json_schema_input_type=float | str | None),
        Field(description="the longest the job may run: seconds, or 30m, 2h; null: no limit"),
    ] = None
    name: Annotated[
        str, BeforeValidator(_name, json_schema_input_type=Annotated[str, Field(max_length=200)] | None)
    ] = ""
    # an explicit idempotency key; otherwise derived from the content
    key: Annotated[
        str | None,
        BeforeValidator(_key, json_schema_input_type=Annotated[str, Field(pattern=_KEY.pattern)] | None),
        Field(description="null: derived from the content"),
    ] = None
    # What the job asks its machine for (gpus, cpus, memory, nodes, partition); empty: the machine's defaults.
    resources: Annotated[
        Resources,
        BeforeValidator(values.given_or({}), json_schema_input_type=Resources | None),
        Field(exclude_if=lambda r: r == NO_RESOURCES),
    ] = dataclasses.field(default_factory=Resources)
    # The Python environment the command runs in, and the container image it runs in
    # (environments/environment.py, environments/image.py); None: the machine's own Python and shell.
    environment: Annotated[
        Environment | None,
        BeforeValidator(_environment, json_schema_input_type=Environment | None),
        AfterValidator(lambda e: e if e != Environment() else None),  # one that asks for nothing is none
        Field(exclude_if=absent),
    ] = None
    # The Secret Manager entry (user:password) for pulling the image from a private registry
    # (environments/image_registry.py).
    registry_secret: Annotated[
        str | None,
        BeforeValidator(
            values.registry_secret,
            json_schema_input_type=Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$")] | None,
        ),
        Field(
            description="the Secret Manager entry (user:password) the job's environment.image is pulled with; "
            "null: the machine's registry_secret",
            exclude_if=absent,
        ),
    ] = None

    # The folder (in the job's work tree) whose complete files come home while the job runs
    # (jobs/checkpoints.py), and how often; None: no checkpoints.
    checkpoints: Annotated[
        RelativePath | None,
        Field(
            description="a folder in the job's work tree (REMOTE_COMPUTE_CHECKPOINT_DIR) whose complete files come "
            "home to .punica/checkpoints/<job id>/ while the job runs and when it ends",
            exclude_if=absent,
        ),
    ] = None
    checkpoint_every: Annotated[
        float | None,
        BeforeValidator(values.duration, json_schema_input_type=float | str | None),
        Field(
            description="how often the checkpoint folder is looked at while the job runs: seconds, or 30s, 5m; "
            f"null: {DEFAULT_CHECKPOINT_EVERY:g} s",
            exclude_if=absent,
        ),
    ] = None

    # When an attempt that ended goes back to the queue, and where the next one may run
    # (jobs/retries.py); None and (): the job ends with its first attempt, on its machine.
    retry: Annotated[
        RetryPolicy | None,
        BeforeValidator(values.given_or(None), json_schema_input_type=RetryPolicy | int | None),
        Field(
            description="the attempts after the first an attempt's end may lead to, and for which causes; a number "
            "N is {max: N}; null: none",
            exclude_if=absent,
        ),
    ] = None
    fallback: Annotated[
        tuple[str, ...],
        BeforeValidator(_fallback, json_schema_input_type=list[str] | None),
        Field(
            description="machines an attempt that ended lost, preempted or machine_unreachable continues on, in "
            "order (the checkpoint set following it); a pool's name: the attempt joins its queue",
            exclude_if=lambda v: not v,
        ),
    ] = ()
    # Who is told of each change of the job's state (jobs/notify.py); (): nobody beyond the panel.
    notify: Annotated[
        tuple[Webhook, ...],
        BeforeValidator(webhooks, json_schema_input_type=list[Webhook | str] | str | None),
        Field(
            description="webhooks each state change is POSTed to as JSON (job, name, machine, state, previous_state, "
            "attempt, reason, cause, at): URLs, or {url, secret: NAME} to sign with a Secret Manager entry",
            exclude_if=lambda v: not v,
        ),
    ] = ()

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return core_schema.no_info_before_validator_function(_spec_in, handler(source))

    @property
    def image(self) -> Image | None:
        """The container image the command runs in (``environment.image``); None: the machine's own shell."""
        return self.environment.image if self.environment else None

    @classmethod
    def from_json(cls, data: Any) -> JobSpec:
        """Build and validate a spec from user input; errors name the setting."""
        return validate(cls, data)

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> JobSpec:
        """A spec as the job state file keeps it: checked when it was submitted, only rebuilt here
        (no validation: a server reads 100,000 of them at start)."""
        command = data["command"]
        resources = data.get("resources")
        return cls(
            machine=data.get("machine") or "local",
            command=command if isinstance(command, str) else tuple(command),
            send=tuple(data.get("send") or ()),
            bring_back=tuple(data.get("bring_back") or ()),
            env=dict(data.get("env") or {}),
            timeout=data.get("timeout"),
            name=data.get("name") or "",
            key=data.get("key"),
            # Most jobs ask for nothing: one shared (frozen) value, not a validation per job read.
            resources=Resources.from_json(resources) if resources else NO_RESOURCES,
            environment=_stored_environment(data),
            registry_secret=data.get("registry_secret"),
            checkpoints=data.get("checkpoints"),
            checkpoint_every=data.get("checkpoint_every"),
            retry=RetryPolicy.from_stored(data.get("retry")),
            fallback=tuple(data.get("fallback") or ()),
            notify=tuple(Webhook.from_stored(w) for w in data.get("notify") or ()),
        )

    def to_json(self) -> dict[str, Any]:
        """The state file's and the API's shape: resources, environment and registry_secret only when
        given, so a job stored before they existed reads back the same."""
        return to_json(JobSpec, self)

    @property
    def command_line(self) -> str:
        """The command as the machine's shell runs it, for people and records: words given apart are quoted."""
        return self.command if isinstance(self.command, str) else shlex.join(self.command)

    @property
    def display_name(self) -> str:
        return self.name or self.command_line

    def secret_refs(self) -> dict[str, str]:
        """Env variable → Secret Manager name, for values written ``secret:NAME``."""
        return {k: ref for k, v in self.env.items() if (ref := resolve_reference(v))}

    def plain_env(self) -> dict[str, str]:
        return {k: v for k, v in self.env.items() if not resolve_reference(v)}

    def screened_settings(self) -> dict[str, Any]:
        """Every user-written value, by the name the user knows it under, for secret screening."""
        settings: dict[str, Any] = {"name": self.name}
        if isinstance(self.command, str):
            settings["command"] = self.command
        else:
            settings.update({f"command[{i}]": arg for i, arg in enumerate(self.command)})
        settings.update({f"env.{k}": v for k, v in self.env.items()})
        settings.update({f"send[{i}]": p for i, p in enumerate(self.send)})
        settings.update({f"bring_back[{i}]": p for i, p in enumerate(self.bring_back)})
        if self.resources.partition:
            settings["resources.partition"] = self.resources.partition
        if self.environment:
            settings.update({f"environment.packages[{i}]": p for i, p in enumerate(self.environment.packages)})
        if self.image:
            settings["environment.image"] = self.image.ref
        if self.checkpoints:
            settings["checkpoints"] = self.checkpoints
        settings.update({f"fallback[{i}]": m for i, m in enumerate(self.fallback)})
        settings.update({f"notify[{i}].url": w.url for i, w in enumerate(self.notify)})
        if self.registry_secret:  # a pasted password instead of a name is caught here
            settings["registry_secret"] = self.registry_secret
        return settings


@with_config(STRICT)
@dataclasses.dataclass(frozen=True, kw_only=True)
class JobRequest(JobSpec):
    """What submits a job (``POST /jobs``): its spec, and whether to start new work when the same is under way."""

    new: Annotated[bool | None, Strict(), Field(description="start a new job even if the same work is under way")] = (
        None
    )

    @property
    def spec(self) -> JobSpec:
        return JobSpec(**{f.name: getattr(self, f.name) for f in dataclasses.fields(JobSpec)})


def _spec_in(data: Any) -> Any:
    if isinstance(data, JobSpec):
        return data
    if not isinstance(data, Mapping):
        raise problem("a job needs an object of settings")
    if "image" in data:
        raise problem(
            "an image is part of the environment now: write environment.image (and environment.runtime)", at="image"
        )
    # An absent command is refused in the words of a wrong one.
    return data if "command" in data else {**data, "command": None}


def _stored_environment(data: Mapping[str, Any]) -> Environment | None:
    """The stored environment; a job stored when the image was a spec field of its own has it moved in."""
    environment = Environment.from_json(data.get("environment"))
    image = Image.from_json(data.get("image"))
    if image is None or (environment and environment.image):
        return environment
    return dataclasses.replace(environment or Environment(), image=image)
