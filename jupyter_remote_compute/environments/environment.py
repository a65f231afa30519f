"""The job's Python environment: asked for in the spec, resolved to content here, built on the far side.

A job may ask for ``requirements`` (a workspace file: requirements.txt, a pyproject.toml with the
uv.lock beside it, or a pylock.toml), ``packages`` added on top, a ``python`` version, and
``same_as_here`` (the distributions of the interpreter it is submitted from), and the container
``image`` (with its ``runtime``) the command and the environment run in. At submit the request
is resolved to content (``resolve``): the texts of those files and the pinned list, whose digest is
part of the job's key and names the environment on the machine.

The content travels as inputs of the job (``environment_inputs``, under ``_remote_compute_env/``,
through the machine's normal send: a lock file of any size), and the job's own ``command.sh``
(``far_command``) runs the far-side script ``engines/farside/env.sh`` ahead of the command: so every
kind (they all end in ``sh command.sh``) makes the environment ready itself, in the job's process,
with nothing to reach on this side. In an image, env.sh runs inside the container, in the machine's
env cache mounted at its own path, and names the environment by the image's pinned digest too: two
images never share one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import re
import shlex
import sys
import uuid
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from ..engines.base import InputFile
from ..engines.farside import tls_script
from ..engines.launcher import command_script
from ..errors import InvalidSettings
from ..fsutil import atomic_write, private_dir
from ..schema.environment import Environment
from ..secrets import URL_CREDENTIALS
from ..workspace import relative_to_note
from . import image as images

#: The name each kind of requirements file takes on the far side (a pyproject's uv.lock goes beside it).
_PYLOCK = re.compile(r"^pylock(\.[A-Za-z0-9_-]+)?\.toml$")
#: Where a job's resolved environment waits between submit and start, in its ``.punica/jobs/<id>/``.
RESOLVED_FILE = "environment.json"
#: A pinned set that needs nothing else (same_as_here alone): env.sh installs it with ``uv pip sync``.
CLOSED_SET = "pinned.txt"
DEFAULT_MAX_AGE_DAYS = 30
DEFAULT_MAX_BYTES = 20 << 30


@dataclasses.dataclass(frozen=True)
class ResolvedEnvironment:
    """An environment as content: what the far side installs, and the digest that names it there."""

    digest: str
    python: str | None
    files: Mapping[str, str]  # far-side name → text
    left_out: tuple[str, ...] = ()  # same_as_here's editable and local installs, named in the log

    def to_json(self) -> dict[str, Any]:
        files, left_out = dict(self.files), list(self.left_out)
        return {"digest": self.digest, "python": self.python, "files": files, "left_out": left_out}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResolvedEnvironment:
        return cls(data["digest"], data.get("python"), dict(data["files"]), tuple(data.get("left_out") or ()))


def _read_workspace_file(root: Path, rel: str, field: str) -> str:
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()):
        raise InvalidSettings(f"{field}: {rel} leads out of the workspace; put the file inside it", field=field)
    if not path.is_file():
        raise InvalidSettings(f"{field}: {rel} is not a file in the workspace; {relative_to_note(root)}", field=field)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidSettings(f"{field}: {rel} cannot be read as text ({e})", field=field) from None


def here_distributions() -> tuple[list[str], list[str]]:
    """The submitting interpreter's distributions pinned (``name==version``), and those left out:
    editable and local-path installs, which no index holds."""
    pinned: dict[str, str] = {}
    left_out: set[str] = set()
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        key = re.sub(r"[-_.]+", "-", name).lower()
        direct = dist.read_text("direct_url.json")
        if direct:
            try:
                origin = json.loads(direct)
            except ValueError:
                origin = {}
            if "dir_info" in origin or str(origin.get("url", "")).startswith("file:"):
                left_out.add(name)
                continue
        pinned.setdefault(key, f"{name}=={dist.version}")
    return sorted(pinned.values(), key=str.lower), sorted(left_out, key=str.lower)


def resolve(env: Environment, root: Path, field: str = "environment") -> ResolvedEnvironment:
    """The request as content; a requirements file missing or outside the workspace is refused, named."""
    files: dict[str, str] = {}
    left_out: list[str] = []
    if env.requirements:
        where = f"{field}.requirements"
        text = _read_workspace_file(root, env.requirements, where)
        name = Path(env.requirements).name
        if name == "pyproject.toml":
            files["pyproject.toml"] = text
            lock = Path(env.requirements).parent / "uv.lock"
            if (root / lock).is_file():
                files["uv.lock"] = _read_workspace_file(root, str(lock), where)
        elif _PYLOCK.match(name):
            files["pylock.toml"] = text
        elif name.endswith(".toml"):
            raise InvalidSettings(
                f"{where}: {env.requirements} is neither a pyproject.toml nor a pylock.toml", field=where
            )
        else:
            files["requirements.txt"] = text
    for text in files.values():
        if URL_CREDENTIALS.search(text):
            where = f"{field}.requirements"
            raise InvalidSettings(
                f"{where}: {env.requirements} has a URL with a user name or password in it; it would be written "
                "on the machine and in the job's records: give the credentials to the job as secrets instead",
                field=where,
            )
    packages = list(env.packages)
    if env.same_as_here:
        pinned, left_out = here_distributions()
        if files or packages:
            packages = pinned + packages
        else:  # the interpreter's whole set is closed: the far side syncs it and resolves nothing
            files[CLOSED_SET] = "".join(p + "\n" for p in pinned)
    if packages:
        files["packages.txt"] = "".join(p + "\n" for p in packages)
    material = json.dumps({"python": env.python, "files": files}, sort_keys=True)
    digest = hashlib.sha256(material.encode()).hexdigest()[:32]
    return ResolvedEnvironment(digest, env.python, files, tuple(left_out))


def save(jobdir: Path, resolved: ResolvedEnvironment) -> None:
    """Keep the resolved content beside the job until it starts (the state file keeps the digest only)."""
    atomic_write(jobdir / RESOLVED_FILE, json.dumps(resolved.to_json()).encode())


def load(jobdir: Path) -> ResolvedEnvironment:
    return ResolvedEnvironment.from_json(json.loads((jobdir / RESOLVED_FILE).read_text(encoding="utf-8")))


def _limit(options: Mapping[str, Any], name: str, default: int) -> int:
    value = options.get(name)
    return default if value in (None, "") else max(0, int(value))


def env_script() -> str:
    """The far side's env.sh (package data beside the other far-side scripts)."""
    env = resources.files("jupyter_remote_compute.engines.farside").joinpath("env.sh").read_text(encoding="utf-8")
    return tls_script() + env


#: Where a job's environment files land in its work tree; command.sh moves them out at once.
SENT_ENV = "_remote_compute_env"


def environment_inputs(job: Any, jobdir: Path, digests: Any) -> list[InputFile]:
    """The environment's files (requirements, lock, packages) as inputs of the job, written once beside
    its resolved content (``<jobdir>/environment/``): they cross by the machine's own send, never in a
    command line, so their size is no kind's concern (a Slurm or SkyPilot start passes command.sh as
    one argument, at most 128 KiB on Linux)."""
    if not builds(job.spec) or not (jobdir / RESOLVED_FILE).is_file():
        return []
    files = []
    for name, text in sorted(load(jobdir).files.items()):
        path, data = jobdir / "environment" / name, text.encode()
        if not path.is_file() or path.read_bytes() != data:
            atomic_write(path, data)
        st = path.stat()
        files.append(InputFile(f"{SENT_ENV}/{name}", path, st.st_size, digests.digest(path, st), 0o644))
    return files


def far_command(
    command: str | Sequence[str],
    resolved: ResolvedEnvironment,
    options: Mapping[str, Any],
    uv: str | None = None,
    sent_uv: str | None = None,
) -> str:
    """The job's command with its environment made ready first: env.sh ahead of it, which builds from
    the files ``environment_inputs`` sent.

    ``options`` are the machine's (``index_url``, ``index_ca_bundle``, ``find_links``, ``wheels``, ``env_max_age_days``,
    ``env_max_bytes``); ``uv``
    a uv binary the far side can run, when this side knows one (the built-in machine shares it);
    ``sent_uv`` the digest of the uv sent with the job (``tool_inputs``).
    """
    q = shlex.quote
    lines = [
        "# The job's environment (jupyter-remote-compute): made ready by env.sh below, then the command.",
        f"rc_env_digest={resolved.digest}",
        f"rc_env_python={q(resolved.python or '')}",
        f"rc_env_index={q(str(options.get('index_url') or ''))}",
        f"rc_env_find_links={q(str(options.get('find_links') or ''))}",
        f"rc_env_ca_bundle={q(str(options.get('index_ca_bundle') or ''))}",
        f"rc_env_offline={'1' if options.get('wheels') == 'from_here' else ''}",
        f"rc_env_uv={q(uv or '')}",
        f"rc_env_sent_uv={sent_uv or ''}",
        f"rc_env_days={_limit(options, 'env_max_age_days', DEFAULT_MAX_AGE_DAYS)}",
        f"rc_env_max_bytes={_limit(options, 'env_max_bytes', DEFAULT_MAX_BYTES)}",
        'rc_env_spec="$(cd .. && pwd -P)/environment"',
        # the files sent (environment_inputs) leave the work tree; a command run again finds them moved
        f"if [ -d {SENT_ENV} ]; then",
        f'  rm -rf -- "$rc_env_spec" && mv -- {SENT_ENV} "$rc_env_spec" || exit 96',
        'else mkdir -p -- "$rc_env_spec" || exit 96; fi',
    ]
    for name in sorted(resolved.files):
        missing = q(f"environment: {name} did not arrive in {SENT_ENV}/")
        lines.append(f'[ -f "$rc_env_spec/{name}" ] || {{ echo {missing} >&2; exit 96; }}')
    for name in resolved.left_out:
        lines.append(f"echo {q(f'environment: {name} is installed here from a local path; left out')}")
    body = command_script(command).removeprefix("#!/bin/sh\n")
    return "\n".join(lines) + "\n" + env_script() + body


def with_machine_default(spec: Any, options: Mapping[str, Any]) -> Any:
    """``spec`` with the machine's defaults where it asks for nothing itself: its Python environment from
    the machine's ``environment`` option, its image from that option's ``image``, else from the options
    ``image`` and ``container_runtime``. The job's own Python part and its own image each win."""
    own = spec.environment or Environment()
    machine = Environment.from_json(options.get("environment"), "options.environment") or Environment()
    python = own.python_part() if own.builds else machine.python_part()
    image = own.image or machine.image or images.machine_default(options)
    merged = dataclasses.replace(python, image=image)
    environment = merged if merged != Environment() else None
    return spec if environment == spec.environment else dataclasses.replace(spec, environment=environment)


def _this_sides_uv() -> Path | None:
    try:
        from uv import find_uv_bin

        return Path(find_uv_bin())
    except (ImportError, FileNotFoundError):
        return None


def _this_sides_uv_version() -> str | None:
    """The version of this side's uv (its package's, which is the binary's), or None without one."""
    if _this_sides_uv() is None:
        return None
    try:
        return importlib.metadata.version("uv")
    except importlib.metadata.PackageNotFoundError:
        return None


#: Where this side's uv lands in a job's work tree; env.sh moves it out to <base>/tools/ at once.
#: Not a dot-name: a Jupyter Server's Contents API refuses hidden paths.
SENT_UV = "_remote_compute_tools/uv"
#: Kinds that get no uv sent: the built-in machine runs this side's in place; an agent fetches only
#: the workspace's inputs.
_NO_SENT_UV = frozenset({"local", "agent"})


def tool_inputs(job: Any, digests: Any, facts: Mapping[str, Any] | None = None) -> list[InputFile]:
    """This side's uv as one more input of a job that has an environment, sent through the machine's
    content cache: once per machine (later jobs find it cached), not executable (so the cache links
    it rather than copies it), used only where the machine has no uv of its own. ``facts``: the
    machine's last check (``machines.facts.known_facts``); one that found a uv there sends none, unknown
    facts send it. A uv for another OS or architecture fails its ``--version`` there and the build
    falls back to venv + pip."""
    if not builds(job.spec) or job.kind in _NO_SENT_UV or not sys.platform.startswith("linux"):
        return []
    if facts and "arch" in facts and facts.get("uv") and job.spec.image is None:
        return []  # the machine's own uv builds it; a container sees none of the machine's programs
    uv = _this_sides_uv()
    if uv is None:
        return []
    st = uv.stat()
    return [InputFile(SENT_UV, uv.resolve(), st.st_size, digests.digest(uv.resolve(), st), 0o644)]


def builder(kind: str, facts: Mapping[str, Any]) -> str | None:
    """What builds a job's Python environment on a machine of ``kind`` whose check found ``facts``, in
    env.sh's order: the machine's uv, else this side's (run in place on the built-in machine, else
    sent with the first job that builds one, ``tool_inputs``), else venv + pip. None where the check
    does not say (a kind whose facts carry no ``arch``). A job in a container image gets this side's
    uv too: the image sees none of the machine's programs."""
    if "arch" not in facts:
        return None
    if facts.get("uv"):
        return f"uv {facts['uv']}, the machine's"
    version = _this_sides_uv_version()
    if version and kind == "local":
        return f"uv {version}, jupyter-remote-compute's, run in place"
    import platform

    same_platform = str(facts.get("kernel", "")).startswith("Linux") and facts.get("arch") == platform.machine()
    if version and kind not in _NO_SENT_UV and sys.platform.startswith("linux") and same_platform:
        return f"uv {version}, jupyter-remote-compute's, sent with the first job that builds one"
    return "venv + pip (no uv there, and none from here that runs there)"


def builds(spec: Any) -> bool:
    """Whether ``spec`` (a JobSpec) asks for a Python environment to be built."""
    return spec.environment is not None and spec.environment.builds


def local_uv(job: Any) -> Path | None:
    """This side's uv when ``job`` builds an environment on the built-in machine (this one), which runs
    it as it is; in an image it is mounted read-only at its own path (environments/image.py)."""
    return _this_sides_uv() if job.kind == "local" and builds(job.spec) else None


def launch_command(job: Any, jobdir: Path, files: Sequence[InputFile] = ()) -> str | Sequence[str]:
    """What the far side runs for ``job``: its command, behind its environment when it has one.
    ``files``: what was sent, a uv from ``tool_inputs`` among them."""
    if not builds(job.spec) or not (jobdir / RESOLVED_FILE).is_file():
        return job.spec.command
    options = job.machine_snapshot.get("options") or {}
    uv = local_uv(job)
    sent = next((f.sha256 for f in files if f.relpath == SENT_UV), None)
    return far_command(job.spec.command, load(jobdir), options, str(uv) if uv else None, sent)


#: Where the wheels of a ``wheels: from_here`` machine land in a job's work tree (env.sh installs from it).
SENT_WHEELS = "_remote_compute_wheels"
_WHEEL_NAME = re.compile(
    r"^(?P<dist>.+?)-(?P<ver>[^-]+)(?:-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)


def _wheel_fits(filename: str, python: str, platform: str) -> bool:
    """Whether a wheel's tags can install on ``platform`` (uv's ``<arch>-manylinux_…`` form) with ``python``."""
    m = _WHEEL_NAME.match(filename)
    if not m:
        return False
    major, minor = [*python.split("."), "0"][:2]
    pys = {f"py{major}", f"py{major}{minor}", f"cp{major}{minor}"}
    abis = {"none", "abi3", f"cp{major}{minor}"}
    arch = platform.split("-", 1)[0]
    plat_ok = any(
        p == "any" or (p.endswith(arch) and ("linux" in p) == ("linux" in platform)) for p in m["plat"].split(".")
    )
    abi3_ok = m["abi"] != "abi3" or any(
        p.startswith("cp3") and int(p[3:] or 0) <= int(minor) for p in m["py"].split(".")
    )
    return plat_ok and abi3_ok and bool(pys & set(m["py"].split("."))) and bool(abis & set(m["abi"].split(".")))


def _locked_wheels(resolved: ResolvedEnvironment, python: str, platform: str, uv: Path, work: Path) -> list[dict]:
    """Resolve the environment here, against this side's index, for the far side's Python and platform:
    the pylock's wheels that fit it, one a package. An unresolvable set fails naming uv's message."""
    import subprocess

    import tomllib

    for name, text in resolved.files.items():
        (work / name).write_text(text, encoding="utf-8")
    sources: list[str] = []
    if "uv.lock" in resolved.files and "pyproject.toml" in resolved.files:
        run = subprocess.run(
            [str(uv), "export", "--frozen", "--no-emit-project", "--no-header", "-q", "-o", "locked.txt"],
            cwd=work,
            capture_output=True,
            text=True,
        )
        if run.returncode:
            raise InvalidSettings(
                f"environment: the uv.lock cannot be exported here for wheels: from_here: {run.stderr.strip()}"
            )
        sources.append("locked.txt")
    else:
        sources += [n for n in ("requirements.txt", "pyproject.toml", "pylock.toml", CLOSED_SET) if n in resolved.files]
    if "packages.txt" in resolved.files:
        sources.append("packages.txt")
    if not sources:
        return []
    (work / "out").mkdir()
    cmd = [str(uv), "pip", "compile", "-q", "--format", "pylock.toml", "--python-platform", platform]
    run = subprocess.run(
        [*cmd, "--python-version", python, *sources, "-o", "out/pylock.toml"],
        cwd=work,
        capture_output=True,
        text=True,
    )
    if run.returncode:
        raise InvalidSettings(
            f"environment: wheels: from_here could not resolve it here for Python {python} on {platform}: "
            + run.stderr.strip()
        )
    wheels: list[dict] = []
    for package in tomllib.loads((work / "out" / "pylock.toml").read_text(encoding="utf-8")).get("packages", []):
        fitting = [w for w in package.get("wheels", []) if _wheel_fits(w["url"].rsplit("/", 1)[-1], python, platform)]
        if not fitting:
            raise InvalidSettings(
                f"environment: {package.get('name')} {package.get('version')} has no wheel for Python {python} "
                f"on {platform} in this side's index (wheels: from_here sends wheels only)"
            )
        wheels.append(fitting[0])
    return wheels


def _fetched(wheel: Mapping[str, Any], cache: Path) -> Path:
    """A wheel in this side's content cache (``<cache>/<sha256>/<file name>``): fetched once, its hash checked."""
    import urllib.request

    url, name = wheel["url"], wheel["url"].rsplit("/", 1)[-1]
    sha = (wheel.get("hashes") or {}).get("sha256")
    if sha and (cache / sha / name).is_file():
        return cache / sha / name
    tmp = cache / f".{name}.{uuid.uuid4().hex}"
    private_dir(cache)
    h = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=120) as got, tmp.open("wb") as out:
        while chunk := got.read(1 << 20):
            h.update(chunk)
            out.write(chunk)
    if sha and h.hexdigest() != sha:
        tmp.unlink()
        raise InvalidSettings(f"environment: {name} from this side's index does not match its hash in the resolution")
    (cache / h.hexdigest()).mkdir(exist_ok=True)
    tmp.replace(cache / h.hexdigest() / name)
    return cache / h.hexdigest() / name


#: uv's ``--python-platform`` for a machine's architecture (``uname -m``, facts.sh's ``arch``).
_ARCH_PLATFORMS = {"x86_64": "x86_64-manylinux_2_28", "aarch64": "aarch64-manylinux_2_28"}


def wheels_platform(options: Mapping[str, Any], facts: Mapping[str, Any] | None) -> str:
    """The platform a ``wheels: from_here`` machine's wheels are for: its ``wheels_platform``, else
    the architecture its last check found, else this side's, on manylinux."""
    import platform as host

    if options.get("wheels_platform"):
        return str(options["wheels_platform"])
    arch = (facts or {}).get("arch")
    return _ARCH_PLATFORMS.get(str(arch)) or f"{host.machine()}-manylinux_2_28"


#: Where, under this side's wheel cache, a ``wheels: from_here`` resolution is kept (``wheel_inputs``).
RESOLUTIONS = "resolutions"
#: This side's uv settings that say where packages come from: a resolution holds only under the same.
_INDEX_SETTINGS = ("UV_DEFAULT_INDEX", "UV_INDEX", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS")


def _resolution_key(digest: str, python: str, platform: str) -> str:
    """The name of a resolution's answer: a hash, since the index URLs may hold credentials."""
    import os

    indexes = {name: os.environ.get(name) for name in _INDEX_SETTINGS}
    material = json.dumps({"env": digest, "python": python, "platform": platform, "indexes": indexes}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


def wheel_inputs(
    job: Any, jobdir: Path, digests: Any, cache: Path, facts: Mapping[str, Any] | None = None
) -> list[InputFile]:
    """The wheels of a job's environment, for a machine with ``wheels: from_here``: resolved here for
    the far side's Python (the environment's own, else this side's) and platform (``wheels_platform``),
    fetched once into ``cache`` and sent as inputs through the machine's content cache, so each wheel
    crosses once per machine; env.sh installs offline. ``facts``: the machine's last check."""
    import tempfile

    options = job.machine_snapshot.get("options") or {}
    if not builds(job.spec) or options.get("wheels") != "from_here" or not (jobdir / RESOLVED_FILE).is_file():
        return []
    uv = _this_sides_uv()
    if uv is None:
        raise InvalidSettings("wheels: from_here needs uv on this side (the uv package)", field="options.wheels")
    resolved = load(jobdir)
    python = resolved.python or f"{sys.version_info.major}.{sys.version_info.minor}"
    target = wheels_platform(options, facts)
    # Resolved once: a later job with the same environment, Python, platform and index reads the answer.
    answer = cache / RESOLUTIONS / f"{_resolution_key(resolved.digest, python, target)}.json"
    try:
        wheels = json.loads(answer.read_bytes())
    except (OSError, ValueError):
        with tempfile.TemporaryDirectory(prefix="rc-wheels-") as work:
            wheels = _locked_wheels(resolved, python, target, uv, Path(work))
        # 0600: the wheels' URLs are the index's, which may carry what the user's uv settings hold
        atomic_write(answer, json.dumps(wheels).encode(), mode=0o600)
    files = []
    for wheel in wheels:
        path = _fetched(wheel, cache)
        st = path.stat()
        files.append(InputFile(f"{SENT_WHEELS}/{path.name}", path, st.st_size, digests.digest(path, st), 0o644))
    return files
