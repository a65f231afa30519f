"""A job whose Python environment is cached, against the same job without one, on ssh; a first
build of 20 packages against `uv pip install -r` run by hand over ssh on the same machine;
``same_as_here`` of this product's own environment against ``uv pip sync`` by hand; and a machine with
``wheels: from_here``, its first and second job, against ``scp`` + ``uv pip install --offline``.

Not a test: it prints figures and the difference against its goal, measured in the same run.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_environments.py [--runs N] [--only CASE ...]

CASE: cached, first_build, same_as_here, from_here (all when none is given).

The machine is the tests' loopback sshd (its test user has no uv: the product's is sent once, before
the runs); packages come from a PEP 503 index on 127.0.0.1 holding one small wheel, as in
tests/test_environments.py. Each run is a new job (``new=True``) submitted and followed by one
``JobService`` to its end, MLflow recording included. Goal: the cached environment adds ≤ 0.3 s.

First build: each run a requirements set of its own (a fresh comment line, so a new digest) naming 20
tiny wheels of the index, installed with no uv cache (the job's env UV_NO_CACHE=1, ``--no-cache`` by
hand). What the build adds to a job (the job with it less the same job without an environment) is set
against one ssh call running the same uv (the one the product sent) as ``uv venv`` + ``uv pip install
-r``. Goal: ≤ 1.1x.

``same_as_here`` of this product's own environment (``--only same_as_here``; run it from ``.venv``, so
the submitting interpreter is the product's: its ~230 distributions pinned, the editable product left
out): each run the far side's built environments are removed, so the job builds it anew, with the far
user's own uv cache warm (warmed once first, from the public index). The job (submit to succeeded) is
set against one ssh call running the same uv as ``uv venv`` + ``uv pip sync`` of the same pins. The
Python is this side's, copied where the far user can read it (its own ``python3`` is Debian's 3.11.2,
which some of the pins refuse, and this side's lives under /root), given to both as ``UV_PYTHON``;
both get this side's ``SSL_CERT_FILE`` too (this machine reaches PyPI through a proxy whose CA only
the system's bundle holds). Goal: ≤ 1.2x.

``wheels: from_here`` (``--only from_here``): each run a new machine whose index points nowhere (a
port nothing listens on), warmed with a one-wheel job so the uv is there already; then a first job of
20 wheels of about 1 MB each (resolved here against the loopback index, fetched into this side's
emptied wheel cache, sent, installed offline) and a second job of 19 of them (a new digest, every
wheel already there). Bytes and seconds of both, against ``scp`` of the same wheels + ``uv venv`` +
``uv pip install --offline`` by hand (the second by hand: the install alone). No uv cache on the far
side; this side's uv resolves with a cache of its own, emptied before each first job and kept for the
second, as a user's would be. Goals: the second job sends no wheel; each job ≤ 1.2x by hand.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from jupyter_remote_compute.jobs.job import parse_time  # noqa: E402 - after the path
from jupyter_remote_compute.jobs.service import JobService, ServiceSettings  # noqa: E402
from jupyter_remote_compute.jobs.spec import JobSpec  # noqa: E402
from jupyter_remote_compute.recording.tracking import TrackingSettings  # noqa: E402
from jupyter_remote_compute.workspace import Workspace  # noqa: E402

GOAL_S = 0.3
GOAL_BUILD_RATIO = 1.1
GOAL_SAME_RATIO = 1.2
GOAL_WHEELS_RATIO = 1.2
BUILD_PACKAGES = [f"rcbench-{i:02d}" for i in range(1, 21)]
#: wheels of about 1 MB each (random, so they do not compress), for wheels: from_here
BIG_PACKAGES = [f"rcbig-{i:02d}" for i in range(1, 21)]
CASES = ("cached", "first_build", "same_as_here", "from_here")


def _index(root: Path):  # type: ignore[no-untyped-def]
    from package_index import Index, wheel

    files = root / "files"
    files.mkdir(parents=True)
    for project in ["rcdemo-a", *BUILD_PACKAGES, *BIG_PACKAGES]:
        body = f"DATA = {base64.b64encode(os.urandom(768 << 10)).decode()!r}\n" if project in BIG_PACKAGES else ""
        wheel(files, project, "1.0", body or "VALUE = 'a1'\n")
        (root / "simple" / project).mkdir(parents=True)
        name = f"{project.replace('-', '_')}-1.0-py3-none-any.whl"
        (root / "simple" / project / "index.html").write_text(f'<a href="../../files/{name}">{name}</a>\n')
    return Index(root)


@contextlib.contextmanager
def loopback_bed(prefix: str, **settings: Any) -> Iterator[tuple[JobService, Any, Any, Path]]:
    """What a benchmark over ssh starts from: a ``JobService`` (``settings`` over a scratch folder and an
    MLflow store of its own) on an empty workspace, the loopback index, the tests' sshd bed (its agent
    in SSH_AUTH_SOCK) and the temporary folder holding them; all stopped and removed after."""
    from sshd_fixture import build_testbed

    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    index = _index(tmp / "index")
    bed = build_testbed()
    os.environ["SSH_AUTH_SOCK"] = str(bed.agent.sock)
    workspace = tmp / "ws"
    (workspace / ".punica").mkdir(parents=True)
    tracking = TrackingSettings(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}", experiment="bench")
    service = JobService(
        Workspace(workspace), ServiceSettings(scratch_dir=tmp / "scratch", tracking=tracking, **settings)
    )
    try:
        yield service, index, bed, tmp
    finally:
        service.close()
        index.stop()
        bed.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _ssh_options(bed) -> list[str]:  # type: ignore[no-untyped-def]
    return ["-F", str(bed.ssh_config), "-o", f"UserKnownHostsFile={bed.known_hosts}", "-o", "BatchMode=yes"]


def _far_run(bed, script: str) -> float:  # type: ignore[no-untyped-def]
    """One ssh call running ``script`` on the far side, as a user would by hand; its seconds."""
    start = time.perf_counter()
    ssh = ["ssh", *_ssh_options(bed), "-p", str(bed.sshd.port), f"{bed.user}@127.0.0.1", script]
    subprocess.run(ssh, check=True, timeout=600)
    return time.perf_counter() - start


def _by_hand(bed, uv: Path, index_url: str, requirements: str) -> float:  # type: ignore[no-untyped-def]
    """One ssh call that builds the same set with uv as a user would: venv, then pip install -r."""
    far = "/tmp/bench-env-by-hand"
    return _far_run(
        bed,
        f"rm -rf {far} && mkdir -p {far} && printf %s {shlex.quote(requirements)} > {far}/req.txt && "
        f"{uv} venv -q {far}/venv && {uv} pip install -q --no-cache --python {far}/venv/bin/python "
        f"--default-index {index_url} -r {far}/req.txt",
    )


def _sent_uv(bed, base_dir: str) -> Path:  # type: ignore[no-untyped-def]
    """The uv the product sent to a machine (``<base>/tools/uv-<digest>``), the one both sides use by hand."""
    return next(bed.far_path(base_dir.removeprefix("~/")).joinpath("tools").glob("uv-*"))


def first_build(service: JobService, bed, index, base: dict, runs: int) -> None:  # type: ignore[no-untyped-def]
    """A new 20-package environment per run, against uv run by hand over ssh (see the module's text)."""
    import uuid

    workspace = service.ctx.workspace.root
    uv = _sent_uv(bed, bed.base_dir)
    plain = JobSpec.from_json(base)
    job_times, plain_times, hand_times = [], [], []
    for _ in range(runs):
        requirements = f"# {uuid.uuid4()}\n" + "".join(p + "\n" for p in BUILD_PACKAGES)
        (workspace / "req.txt").write_text(requirements)
        spec = JobSpec.from_json({**base, "env": {"UV_NO_CACHE": "1"}, "environment": {"requirements": "req.txt"}})
        start = time.perf_counter()
        job = service.wait(service.submit(spec, new=True).job.id, timeout=300)
        job_times.append(time.perf_counter() - start)
        assert job.state == "succeeded", job.reason
        start = time.perf_counter()
        job = service.wait(service.submit(plain, new=True).job.id, timeout=300)
        plain_times.append(time.perf_counter() - start)
        hand_times.append(_by_hand(bed, uv, index.url, requirements))
    built = statistics.median(job_times) - statistics.median(plain_times)
    hand = statistics.median(hand_times)
    print(f"first build of {len(BUILD_PACKAGES)} packages on ssh, {runs} runs, median")
    print(f"  job with a new environment {statistics.median(job_times):6.2f} s")
    print(f"  the same job without one   {statistics.median(plain_times):6.2f} s")
    print(f"  uv venv + uv pip install -r by hand over ssh {hand:6.2f} s")
    ratio = built / hand
    print(f"  the build adds {built:.2f} s to the job: {ratio:.2f}x by hand; goal <= {GOAL_BUILD_RATIO}x")


def _build_seconds(service: JobService, job_id: str) -> str:
    """What the far side's log says the build took (env.sh's whole seconds), or '?'."""
    found = re.search(r": built in (\d+) s", service.read_log(job_id).data.decode(errors="replace"))
    return found.group(1) if found else "?"


def _before_start(job) -> float:  # type: ignore[no-untyped-def]
    """Seconds from submit to started: this side's part (resolving, fetching, sending) and the start."""
    return parse_time(job.started) - parse_time(job.created)


def _run(service: JobService, spec: JobSpec, timeout: float = 300):  # type: ignore[no-untyped-def]
    """One new job to its end; it and its seconds (submit to succeeded)."""
    start = time.perf_counter()
    job = service.wait(service.submit(spec, new=True).job.id, timeout=timeout)
    seconds = time.perf_counter() - start
    assert job.state == "succeeded", job.reason
    return job, seconds


def cached(service: JobService, base: dict, runs: int) -> None:
    """A job with a cached environment against the same job without one, interleaved."""
    cases = {
        "no environment": JobSpec.from_json(base),
        "cached environment": JobSpec.from_json({**base, "environment": {"packages": ["rcdemo-a"]}}),
    }
    for spec in cases.values():  # warm: the environment built, uv sent, MLflow's store made
        _run(service, spec)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, spec in cases.items():  # interleaved, so a change of load hits both alike
            times[name].append(_run(service, spec)[1])
    print(f"ssh job, {runs} runs each, median (load average {os.getloadavg()[0]:.1f})")
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, median in medians.items():
        print(f"  {name:20s} {median:6.2f} s   (min {min(times[name]):.2f} s)")
    extra = medians["cached environment"] - medians["no environment"]
    print(f"  the cached environment adds {extra:+.2f} s; goal ≤ {GOAL_S} s ({extra / GOAL_S:.2f}x the goal)")


def _python_for_far(tmp: Path) -> tuple[str, str]:
    """This side's Python copied where the far user can read it (no site-packages): its interpreter
    and its lib folder (the interpreter's RUNPATH names the original, so LD_LIBRARY_PATH names this)."""
    copy = tmp / "python"
    ignore = shutil.ignore_patterns("site-packages", "test", "__pycache__")
    for part in ("bin", "lib", "include"):
        shutil.copytree(Path(sys.base_prefix) / part, copy / part, symlinks=True, ignore=ignore)
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (copy / "lib" / minor / "site-packages").mkdir()
    tmp.chmod(0o755)
    subprocess.run(["chmod", "-R", "a+rX", str(copy)], check=True)
    return str(copy / "bin" / minor), str(copy / "lib")


def same_as_here(service: JobService, bed, tmp: Path, base: dict, runs: int) -> None:  # type: ignore[no-untyped-def]
    """This interpreter's environment built anew on the far side (its uv cache warm), against uv by hand."""
    from jupyter_remote_compute.environments.environment import here_distributions

    pinned, left_out = here_distributions()
    python, lib = _python_for_far(tmp)
    env = {"UV_PYTHON": python, "LD_LIBRARY_PATH": lib}
    if os.environ.get("SSL_CERT_FILE"):  # this machine reaches the index through a proxy whose CA is there
        env["SSL_CERT_FILE"] = os.environ["SSL_CERT_FILE"]
    spec = JobSpec.from_json({**base, "env": env, "environment": {"same_as_here": True}})
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k != "UV_PYTHON")
    far = "/tmp/bench-env-same-by-hand"
    pins = "".join(p + "\n" for p in pinned)

    def by_hand(uv: Path, how: str = "sync") -> float:
        """``how``: sync (the pins as they are) or install -r (a resolution, as env.sh runs it)."""
        _far_run(bed, f"rm -rf {far} && mkdir -p {far}")  # not timed: a 1 GB venv takes seconds to remove
        return _far_run(
            bed,
            f"export {exports} && "
            f"printf %s {shlex.quote(pins)} > {far}/req.txt && {uv} venv -q --python {python} {far}/venv && "
            f"{uv} pip {how} {far}/req.txt -q --python {far}/venv/bin/python",
        )

    envs = bed.far_path(bed.base_dir.removeprefix("~/")) / "envs"
    # Warm: the product's own build fills the far user's uv cache from the public index and sends uv.
    job, seconds = _run(service, spec, timeout=1800)
    uv = _sent_uv(bed, bed.base_dir)
    print(f"same_as_here warm-up: {seconds:.1f} s; by hand after it {by_hand(uv):.1f} s")
    job_times, hand_times, install_times, far_build, before = [], [], [], [], []
    for _ in range(runs):
        shutil.rmtree(envs)  # nothing built there any more: the job builds its environment anew
        job, seconds = _run(service, spec)
        job_times.append(seconds)
        far_build.append(_build_seconds(service, job.id))
        before.append(_before_start(job))
        hand_times.append(by_hand(uv))
        install_times.append(by_hand(uv, "install -r"))
    _far_run(bed, f"rm -rf {far}")  # the by-hand venv: 1 GB
    job_median, hand = statistics.median(job_times), statistics.median(hand_times)
    print(f"same_as_here of this interpreter ({len(pinned)} distributions pinned, left out: {', '.join(left_out)})")
    print(f"  on ssh, far uv cache warm, {runs} runs, median (load average {os.getloadavg()[0]:.1f})")
    print(f"  job, submit to succeeded      {job_median:6.2f} s   (min {min(job_times):.2f} s)")
    print(f"    submit to started           {statistics.median(before):6.2f} s")
    print(f"    env.sh's build              {', '.join(far_build)} s (whole seconds, per run)")
    print(f"  uv venv + uv pip sync by hand {hand:6.2f} s   (min {min(hand_times):.2f} s)")
    install = statistics.median(install_times)
    print(
        f"  the same by hand with uv pip install -r (env.sh's command) {install:.2f} s: "
        f"the job is {job_median / install:.2f}x it"
    )
    print(
        "  per run, job / sync / install -r by hand: "
        + ", ".join(f"{j:.1f}/{h:.1f}/{i:.1f} s" for j, h, i in zip(job_times, hand_times, install_times, strict=True))
    )
    print(f"  {job_median / hand:.2f}x by hand; goal <= {GOAL_SAME_RATIO}x")


def _resolving(workspace: Path, packages: list[str]) -> float:
    """Seconds of the product's own resolution at a from_here start (uv pip compile here), alone."""
    from jupyter_remote_compute.environments.environment import Environment, _locked_wheels, _this_sides_uv, resolve

    resolved = resolve(Environment(packages=tuple(packages)), workspace)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        _locked_wheels(resolved, python, "x86_64-manylinux_2_28", _this_sides_uv(), Path(work))  # type: ignore[arg-type]
        return time.perf_counter() - start


def from_here(service: JobService, bed, index, tmp: Path, base: dict, runs: int) -> None:  # type: ignore[no-untyped-def]
    """wheels: from_here, a new machine each run: the first job of 20 wheels and a second of 19, against
    scp of the wheels + uv pip install --offline by hand (see the module's text)."""
    with socket.socket() as s:  # a port nothing listens on: the far side has no index to reach
        s.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{s.getsockname()[1]}/simple/"
    os.environ["UV_DEFAULT_INDEX"] = index.url  # this side's own index, as a user's setting
    here_cache = tmp / "uv-cache-here"  # this side's uv cache: emptied before each first job
    os.environ["UV_CACHE_DIR"] = str(here_cache)
    workspace = service.ctx.workspace.root
    (workspace / "big.txt").write_text("".join(p + "\n" for p in BIG_PACKAGES))
    stage = tmp / "by-hand" / "wheels"
    stage.mkdir(parents=True)
    for wheel in (index.root / "files").glob("rcbig_*.whl"):
        shutil.copy(wheel, stage)
    size = sum(w.stat().st_size for w in stage.iterdir())
    far = "/tmp/bench-wheels-by-hand"

    def install_script(uv: Path, venv: str, packages: list[str]) -> str:
        """The far side's part by hand: a venv and the install from the wheels there, offline."""
        reqs = shlex.quote("".join(p + "\n" for p in packages))
        return (
            f"printf %s {reqs} > {far}/{venv}.txt && {uv} venv -q {far}/{venv} && {uv} pip install -q --no-cache "
            f"--offline --no-index --find-links {far}/wheels --python {far}/{venv}/bin/python -r {far}/{venv}.txt"
        )

    scp = ["scp", "-q", "-r", *_ssh_options(bed), "-P", str(bed.sshd.port)]
    rows: dict[str, list[float]] = {k: [] for k in ("plain", "first", "second", "hand1", "hand2", "resolve")}
    sent: dict[str, list[int]] = {"first": [], "second": []}
    before: dict[str, list[float]] = {"first": [], "second": []}
    built: dict[str, list[str]] = {"first": [], "second": []}
    files: dict[str, list[str]] = {"first": [], "second": []}
    for n in range(runs):
        name = f"island-{n}"
        options = bed.options(index_url=nowhere, wheels="from_here", base_dir=f"{bed.base_dir}/{name}")
        service.machines.add(name, "ssh", "127.0.0.1", options)
        on = {**base, "machine": name, "env": {"UV_NO_CACHE": "1"}}
        _run(service, JobSpec.from_json({**on, "environment": {"packages": ["rcdemo-a"]}}))  # uv sent, not timed
        rows["plain"].append(_run(service, JobSpec.from_json({**base, "machine": name}))[1])
        for first_time in (workspace / ".punica" / "wheels", here_cache):  # resolved and fetched anew
            shutil.rmtree(first_time, ignore_errors=True)
        for which, environment in (("first", {"requirements": "big.txt"}), ("second", {"packages": BIG_PACKAGES[:-1]})):
            job, seconds = _run(service, JobSpec.from_json({**on, "environment": environment}))
            rows[which].append(seconds)
            before[which].append(_before_start(job))
            built[which].append(_build_seconds(service, job.id))
            sent[which].append(int(job.transfer.get("bytes_sent", 0)))
            files[which].append(f"{job.transfer.get('files_sent', 0)}/{job.transfer.get('files_reused', 0)}")
        rows["resolve"].append(_resolving(workspace, BIG_PACKAGES[:-1]))
        uv = _sent_uv(bed, options["base_dir"])
        _far_run(bed, f"rm -rf {far} && mkdir -p {far}")
        start = time.perf_counter()
        subprocess.run([*scp, str(stage), f"{bed.user}@127.0.0.1:{far}/"], check=True, timeout=300)
        _far_run(bed, install_script(uv, "venv", BIG_PACKAGES))
        rows["hand1"].append(time.perf_counter() - start)
        rows["hand2"].append(_far_run(bed, install_script(uv, "venv2", BIG_PACKAGES[:-1])))
    _far_run(bed, f"rm -rf {far}")
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"wheels: from_here on ssh, {len(BIG_PACKAGES)} wheels of {size / len(BIG_PACKAGES) / 1e6:.2f} MB")
    print(f"  a new machine each run, {runs} runs, median (load average {os.getloadavg()[0]:.1f})")
    print(f"  the same job without an environment {med['plain']:6.2f} s")
    for which, hand, what in (
        ("first", "hand1", "scp + uv venv + uv pip install --offline"),
        ("second", "hand2", "uv venv + uv pip install --offline"),
    ):
        mb = statistics.median(sent[which]) / 1e6
        print(f"  {which} job {med[which]:6.2f} s, {mb:6.2f} MB sent (files sent/reused {', '.join(files[which])})")
        print(
            f"    submit to started {statistics.median(before[which]):.2f} s; "
            f"env.sh's build {', '.join(built[which])} s (whole seconds, per run)"
        )
        print(f"    by hand ({what}) {med[hand]:6.2f} s: {med[which] / med[hand]:.2f}x; goal <= {GOAL_WHEELS_RATIO}x")
    print(f"  the second job sent {max(sent['second'])} bytes at most; goal: no wheel again")
    print(f"  where the second job's start goes: the resolution here alone takes {med['resolve']:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--only", choices=CASES, nargs="+", help="the cases to run (all when not given)")
    args = parser.parse_args()
    only = args.only or list(CASES)
    with loopback_bed("bench-env-", poll_interval=0.05) as (service, index, bed, tmp):
        (service.workspace.root / "fit.py").write_text("import sys\nprint('hello from', sys.prefix)\n")
        service.machines.add("far", "ssh", "127.0.0.1", bed.options(index_url=index.url))
        base = {"machine": "far", "command": ["python3", "fit.py"], "send": ["fit.py"]}
        if "cached" in only:
            cached(service, base, args.runs)
        if "first_build" in only:
            first_build(service, bed, index, base, args.runs)
        if "same_as_here" in only:  # from the public index: the machine names none
            service.machines.add("pypi", "ssh", "127.0.0.1", bed.options())
            same_as_here(service, bed, tmp, {**base, "machine": "pypi", "command": ["python", "fit.py"]}, args.runs)
        if "from_here" in only:  # last: it sets this side's uv settings
            from_here(service, bed, index, tmp, base, args.runs)


if __name__ == "__main__":
    main()
