"""The far-side contract: what every push engine asks of its machine, written once as POSIX sh.

Each script beside this module is run as ``sh -c <script> sh ARGS...`` by every
push engine its own way (the built-in machine through ``subprocess``, ssh over
an exec channel, jupyter from its kernel), and its answer is read here, once:

==============  =====================================================================
``status.sh``   state of many jobs at once: exit code, live process group, log size; with
                ``--metrics``, the new bytes of watched jobs' MLflow metric files too
``cancel.sh``   TERM the group, KILL after the grace, verify none of it remains
``manifest.sh`` one tar of the declared outputs, their sha256 (hashed as they stream) at its end
``cache.sh``    the content-addressed input cache: have, link, adopt, evict
``facts.sh``    OS, kernel, Python, CPUs, memory, GPUs (nvidia-smi), free disk, whether the
                package index is reached and trusted (after ``tls.sh``, as env.sh is)
``prepare.sh``  make a job's folder and mark it (job.json); another job's folder is refused
``log.sh``      a window of a job's log (a removed job folder is an error, not an empty log)
``envfile.sh``  a job's environment as a 0600 file, for a job another program starts (sbatch)
``cleanup.sh``  remove a job's folder, only the one whose job.json names that job
==============  =====================================================================

A kind's own far side is here too: ``slurm-check.sh`` (what a login node offers, in one round trip)
and ``skypilot-start.sh`` (the SkyPilot job that starts the launcher and lasts as long as the command).

``kernel.py`` is the Jupyter kind's far side: the standard-library program its kernel runs
(``kernel_program``), which runs these scripts there and moves bytes through the kernel.

Every tar stream that comes back goes through ``receive_outputs`` and so through
one policy (``ssh_transfer.SafeExtractor``): the whole archive is refused on any
escaping, absolute, link, device or unrequested entry.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import re
import shlex
import tarfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from ..base import (
    TRACKING_DIR,
    WORK_DIR,
    EngineError,
    Facts,
    FetchResult,
    InputFile,
    MetricBytes,
    MetricOffsets,
    OptionField,
    RemoteJob,
    RemoteStatus,
)
from ..launcher import LAUNCH_SH, RUN_SH
from ..ssh_transfer import (
    ArchiveCut,
    SafeExtractor,
    TarReader,
    UnsafeArchive,
    check_relpath,
    padding,
    parse_sha256sum,
)

SCRIPTS = (
    "status",
    "cancel",
    "manifest",
    "checkpoints",
    "cache",
    "facts",
    "prepare",
    "log",
    "envfile",
    "cleanup",
    "container",
    "slurm-check",
    "skypilot-start",
    "rank",
)
#: The machine options facts.sh takes after its folder: the index it checks and the CA bundle it trusts.
INDEX_OPTIONS = ("index_url", "index_ca_bundle")
#: A job id as the far side's scripts take it: one plain name, so it is a folder name and a word in sh.
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

#: A far disk never fills with old inputs: at most this many bytes of unused cache entries...
DEFAULT_CACHE_MAX_BYTES = 20 << 30
#: ...and none unused for longer than this many days.
DEFAULT_CACHE_MAX_AGE_DAYS = 14

CACHE_OPTIONS: Mapping[str, OptionField] = {
    "cache_max_bytes": OptionField(
        int, f"Most bytes the input cache on the machine keeps (default {DEFAULT_CACHE_MAX_BYTES >> 30} GiB)"
    ),
    "cache_max_age_days": OptionField(
        int, f"Days an unused input stays in the machine's cache (default {DEFAULT_CACHE_MAX_AGE_DAYS})"
    ),
}


@functools.cache
def script(name: str) -> str:
    """The text of one far-side script (one of ``SCRIPTS``)."""
    if name not in SCRIPTS:
        raise KeyError(f"no far-side script {name!r}")
    text = resources.files(__package__).joinpath(f"{name}.sh").read_text(encoding="utf-8")
    # facts.sh checks the package index with the trust env.sh builds with: tls.sh's, ahead of both
    return tls_script() + text if name == "facts" else text


@functools.cache
def tls_script() -> str:
    """``tls.sh``: the trust a package index's certificate is checked with, ahead of env.sh and facts.sh."""
    return resources.files(__package__).joinpath("tls.sh").read_text(encoding="utf-8")


@functools.cache
def kernel_program() -> str:
    """The source of the Jupyter kind's far-side program (``kernel.py``), run by the server's kernel."""
    return resources.files(__package__).joinpath("kernel.py").read_text(encoding="utf-8")


def job_marker(job_id: str, key: str) -> str:
    """The text of a job folder's ``job.json``: what ``prepare.sh`` writes and compares, on every kind."""
    if not _JOB_ID.fullmatch(job_id) or not _JOB_ID.fullmatch(key):
        raise ValueError(f"job id: {job_id!r} (key {key!r}) must be a plain name of letters, digits, '.', '_', '-'")
    return json.dumps({"job_id": job_id, "key": key}, sort_keys=True) + "\n"


def prepare_args(job_dir: str, job_id: str, key: str) -> list[str]:
    """``prepare.sh``'s arguments for a job's folder: the folder, its marker and the launcher's scripts."""
    return [job_dir, job_marker(job_id, key), LAUNCH_SH, RUN_SH]


def argv(name: str, *args: str) -> list[str]:
    """The script as an argument vector, for ``subprocess`` (local, jupyter's kernel)."""
    return ["sh", "-c", script(name), "sh", *args]


def command_line(name: str, *words: str) -> str:
    """The script as one sh command line (ssh); each word is quoted unless it is a raw sh word."""
    return "sh -c " + shlex.quote(script(name)) + " sh " + " ".join(words)


def cache_limits(options: Mapping[str, Any]) -> tuple[int, int]:
    """(max age in days, max bytes) of a machine's input cache, from its options."""
    days = options.get("cache_max_age_days")
    size = options.get("cache_max_bytes")
    days = DEFAULT_CACHE_MAX_AGE_DAYS if days in (None, "") else int(days)
    size = DEFAULT_CACHE_MAX_BYTES if size in (None, "") else int(size)
    if days < 0 or size < 0:
        raise EngineError("cache_max_age_days and cache_max_bytes must not be negative")
    return days, size


# -- reading the answers -----------------------------------------------------------------------


#: A running job's reason while env.sh builds its environment (status.sh's "building" line).
BUILDING = "building the environment"


def building_reason(tool: str, packages: int) -> str:
    """A running job's reason while its environment is built: "building the environment (uv, 3 packages)"."""
    return f"{BUILDING} ({tool}, {packages} package{'' if packages == 1 else 's'})"


def parse_status(out: str, jobs: Sequence[RemoteJob], machine: str) -> dict[str, RemoteStatus]:
    """status.sh's lines, one per job in the order given, as RemoteStatus by job id."""
    states: dict[int, tuple[str, str]] = {}
    sizes: dict[int, int] = {}
    building: dict[int, str] = {}
    warned: set[int] = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "size" and parts[1].isdigit() and parts[2].isdigit():
            sizes[int(parts[1])] = int(parts[2])
        elif len(parts) == 4 and parts[0] == "building" and parts[1].isdigit() and parts[3].isdigit():
            building[int(parts[1])] = building_reason(parts[2], int(parts[3]))
        elif len(parts) == 2 and parts[0] == "warned" and parts[1].isdigit():
            warned.add(int(parts[1]))
        elif len(parts) == 3 and parts[0].isdigit() and int(parts[0]) < len(jobs):
            states[int(parts[0])] = (parts[1], parts[2])
    result: dict[str, RemoteStatus] = {}
    for index, (state, code) in states.items():
        job, log_size = jobs[index], sizes.get(index)
        if state == "exited":
            exit_code = int(code) if code.lstrip("-").isdigit() else None
            result[job.job_id] = RemoteStatus("exited", exit_code=exit_code, log_size=log_size)
        elif state == "running":
            result[job.job_id] = RemoteStatus("running", log_size=log_size, detail=building.get(index, ""))
        elif state == "cancelled":
            result[job.job_id] = RemoteStatus("gone", log_size=log_size, detail="cancelled")
        elif state == "notstarted":
            result[job.job_id] = RemoteStatus("gone", log_size=log_size, detail="never started")
        else:
            detail = "job directory is missing" if state == "missing" else "process vanished"
            result[job.job_id] = RemoteStatus("gone", log_size=log_size, detail=f"{detail} on {machine}")
    for index in warned & set(states):
        result[jobs[index].job_id] = dataclasses.replace(result[jobs[index].job_id], warned=True)
    missing = [j.job_id for j in jobs if j.job_id not in result]
    if missing:
        raise EngineError(f"{machine}: the status gave no answer for {', '.join(missing)}", transient=True)
    return result


METRICS_MARK = b"\n@@metrics\n"
#: The most a poll brings of one metric file (status.sh's cap); the rest comes with the next poll.
METRIC_READ_CAP = 1 << 20


def status_words(dirs: Sequence[str], watched: bool) -> list[str]:
    """status.sh's arguments: ``--metrics`` first when some of the jobs are watched."""
    return ["--metrics", *dirs] if watched else list(dirs)


def watch_input(jobs: Sequence[RemoteJob], watched: Mapping[str, MetricOffsets]) -> bytes:
    """status.sh's standard input with ``--metrics``: the watched jobs by index, and what was read of each file."""
    lines = []
    for index, job in enumerate(jobs):
        offsets = watched.get(job.job_id)
        if offsets is None:
            continue
        lines.append(f"watch {index}")
        for path, offset in sorted(offsets.items()):
            if "\n" not in path and "\r" not in path:
                lines.append(f"at {index} {int(offset)} {path}")
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def split_metrics(out: bytes) -> tuple[str, bytes]:
    """status.sh's answer as (the status lines as text, the metric blocks after ``@@metrics``)."""
    head, _, blob = out.partition(METRICS_MARK)
    return head.decode("utf-8", "replace"), blob


def parse_metrics(blob: bytes, jobs: Sequence[RemoteJob]) -> dict[str, MetricBytes]:
    """status.sh's metric blocks (``metric <index> <offset> <count> <path>`` + bytes) by job id."""
    found: dict[str, MetricBytes] = {}
    at = 0
    while at < len(blob):
        end = blob.find(b"\n", at)
        if end < 0:
            break
        words = blob[at:end].decode("utf-8", "surrogateescape").split(" ", 4)
        if len(words) != 5 or words[0] != "metric" or not all(w.isdigit() for w in words[1:4]):
            raise EngineError(f"unexpected metric header from the machine: {blob[at:end][:200]!r}", transient=True)
        index, offset, count, path = int(words[1]), int(words[2]), int(words[3]), words[4]
        data = blob[end + 1 : end + 1 + count]
        at = end + 1 + count
        if index < len(jobs):
            found.setdefault(jobs[index].job_id, {})[path] = (offset, data)
    return found


def cancel_ticks(grace: float) -> str:
    """cancel.sh's grace argument: tenths of a second."""
    return str(max(0, int(grace * 10)))


def have_input(digests: Iterable[str]) -> bytes:
    """``cache.sh have``'s standard input."""
    return ("\n".join(sorted(set(digests))) + "\n\n").encode("ascii")


def parse_have(out: str) -> dict[str, int]:
    """``cache.sh have``'s answer: the size of every cached digest asked for."""
    have = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].isdigit():
            have[fields[0]] = int(fields[1])
    return have


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8", "surrogateescape")).decode("ascii")


def link_input(files: Iterable[InputFile]) -> bytes:
    """``cache.sh link``'s standard input: names travel base64-encoded, so any name is safe."""
    return "".join(f"{f.sha256} {f.mode & 0o7777:o} {_b64(f.relpath)}\n" for f in files).encode("ascii")


def adopt_input(files: Iterable[InputFile]) -> bytes:
    """``cache.sh adopt``'s standard input."""
    return "".join(f"{f.sha256} {f.size} {f.mode & 0o7777:o} {_b64(f.relpath)}\n" for f in files).encode("ascii")


def parse_marked(out: str, mark: str) -> list[str]:
    """The words after ``mark`` in cache.sh's answer (``missing`` digests, ``bad`` base64 names decoded)."""
    found = []
    for line in out.splitlines():
        word, _, rest = line.partition(" ")
        if word == mark and rest:
            found.append(base64.b64decode(rest).decode("utf-8", "surrogateescape") if mark == "bad" else rest)
    return found


def _int(value: str | None) -> int:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return 0


def parse_facts(out: str, rtt_ms: float, **extras: Any) -> Facts:
    """facts.sh's lines as the one facts shape every kind returns."""
    facts: dict[str, str] = {}
    gpus: list[dict[str, Any]] = []
    containers: list[dict[str, Any]] = []
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key == "container" and len(words := value.split()) == 3:
            containers.append({"runtime": words[0], "version": words[1], "rootless": words[2] == "rootless"})
        elif key == "container_nvidia" and len(words := value.split()) == 2:
            for container in containers:  # facts.sh prints it after its runtime's container= line
                if container["runtime"] == words[0]:
                    container["nvidia"] = words[1] == "yes"
        elif key == "gpu":
            name, _, mem = value.rpartition(",")
            gpus.append({"name": name.strip(), "memory_bytes": _int(mem) * (1 << 20) if _int(mem) else None})
        elif key:
            facts[key] = value.strip()
    memory = _int(facts.get("mem_kb")) * 1024 if facts.get("mem_kb") else _int(facts.get("mem_b"))
    python = facts.get("python", "")
    if facts.get("arch"):
        # the facts.sh that names the architecture also says whether uv runs there: None for "none"
        extras = {**extras, "arch": facts["arch"], "uv": facts.get("uv") or None}
    if facts.get("index"):
        extras = {**extras, "index": facts["index"]}
    return Facts(
        os=facts.get("distro") or facts.get("os", ""),
        kernel=f"{facts.get('os', '')} {facts.get('kernel', '')}".strip(),
        python=python.removeprefix("Python ").strip() if python.startswith("Python ") else None,
        cpus=_int(facts.get("cpus")),
        memory_bytes=memory or None,
        gpus=gpus,
        disk_free_bytes=_int(facts.get("disk_kb")) * 1024,
        rtt_ms=round(rtt_ms, 2),
        extras={**extras, "containers": containers} if containers else extras,
    )


# -- the tar stream that comes back ------------------------------------------------------------


class NoManifest(EngineError):
    """The stream did not start with the manifest: the far side failed before it sent anything."""


class NoDigests(ArchiveCut):
    """The stream ended before the digests that close it: cut short, or the far side failed midway."""


#: The far side's list of digests, the stream's last entry, is named after its first one.
SUMS_SUFFIX = ".sums"


def receive_outputs(
    read: Callable[[int], bytes],
    outputs: Sequence[str],
    dest: Path,
    manifest: str,
    source: str,
    progress: Callable[[int, int], None] | None = None,
    extractor: SafeExtractor | None = None,
) -> FetchResult:
    """Read manifest.sh's tar stream into ``dest`` (``work/<output>``, ``mlruns/``) under the one policy.

    The far side's sha256 of every file arrive last (the entry ``<manifest>.sums``): they are
    computed while the files stream. A stream that ends without them raises ``NoDigests``; any
    refused entry refuses the whole archive, and what was written of it is removed again.
    Files the far side left out (``--direct``) are the caller's to fetch, through ``extractor``
    (``output_extractor``'s) so they land under the same policy.
    """
    if extractor is None:
        extractor = output_extractor(outputs, dest, source)
    reader = TarReader(read)
    members = iter(reader.members(across_archives=True))
    first = next(members, None)
    if first is None or first.name.removeprefix("./") != manifest:
        raise NoManifest(f"{source}: no output list came back")
    result = FetchResult()
    total = 0
    sums = bytearray()
    for line in _small_entry(reader, first, source).split(b"\n"):
        if line.startswith(b"M "):
            result.missing.append(outputs[int(line[2:])])
        elif line.startswith(b"T "):
            total = int(line[2:]) * 1024
        elif line.startswith(b"D "):
            continue  # left out for the caller (``direct_files``)
        elif line:
            sums += line + b"\n"  # an older far side listed the digests here, before the files
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(done, max(total, done))

    closed = False
    try:
        for info in members:
            if closed:
                raise UnsafeArchive(f"{source}: the archive goes on after its list of digests; nothing was kept")
            if info.name.removeprefix("./") == manifest + SUMS_SUFFIX:
                sums += _small_entry(reader, info, source)
                closed = True
                continue
            extractor.extract(reader, info, tick)
    except UnsafeArchive:
        extractor.discard()
        raise
    if not closed and not sums:
        raise NoDigests(f"{source}: the outputs' stream ended before their digests: it was cut short")
    for name, digest in parse_sha256sum(bytes(sums)).items():
        if name.startswith(WORK_DIR + "/"):
            result.digests[name.removeprefix(WORK_DIR + "/")] = digest
    result.received = {
        name.removeprefix(WORK_DIR + "/"): digest
        for name, digest in extractor.digests.items()
        if name.startswith(WORK_DIR + "/")
    }
    return result


def parse_checkpoint_listing(out: str) -> dict[str, tuple[int, int]]:
    """checkpoints.sh's lines: path under the checkpoint folder -> (size, mtime in ns); a path that is
    not plain (it would climb out) is left out."""
    listing: dict[str, tuple[int, int]] = {}
    for line in out.splitlines():
        size, mtime, encoded = line.split(" ", 2)
        rel = base64.b64decode(encoded).decode("utf-8", "surrogateescape")
        try:
            check_relpath(rel, "checkpoint")
        except ValueError:
            continue
        listing[rel] = (int(size), int(mtime))
    return listing


def output_extractor(outputs: Sequence[str], dest: Path, source: str) -> SafeExtractor:
    """The one policy for what comes back: files under ``work/<output>`` and ``mlruns/`` only."""
    wanted = [f"{WORK_DIR}/{o}" for o in outputs]

    def allowed(name: str) -> bool:
        if name == TRACKING_DIR or name.startswith(TRACKING_DIR + "/"):
            return True
        return any(name == w or name.startswith(w + "/") for w in wanted)

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    return SafeExtractor(dest, allowed, source)


def direct_files(first_entry: bytes) -> list[tuple[str, int, int]]:
    """The files ``manifest.sh --direct`` left out of its stream, from its first entry: (path, size, mode)."""
    found = []
    for line in first_entry.split(b"\n"):
        if line.startswith(b"D "):
            _, size, mode, name = line.split(b" ", 3)
            found.append((base64.b64decode(name).decode("utf-8", "surrogateescape"), int(size), int(mode, 8)))
    return found


def _small_entry(reader: TarReader, info: tarfile.TarInfo, source: str) -> bytes:
    """The whole data of one of the stream's own entries (the list first, the digests last)."""
    if info.size > 256 << 20:
        raise UnsafeArchive(f"{source}: the output list is implausibly large")
    return reader.read_exact(info.size + len(padding(info.size)))[: info.size]


def extract_archive(path: Path, outputs: Sequence[str], dest: Path, manifest: str, source: str) -> FetchResult:
    """``receive_outputs`` for a tar stream that came back as a file (jupyter downloads it whole)."""
    with open(path, "rb") as f:
        return receive_outputs(f.read, outputs, dest, manifest, source)
