"""container.sh's own moments that no real runtime lets a test time: a TERM that comes while the
container is still being created, and a failed run whose runtime warned on the way.

The runtime is a script on PATH that plays podman's part with a pause where the test needs one
(``test_container_gpus`` runs container.sh the same way for the GPU flags).
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from test_container_gpus import IMAGE_ID, _executable
from waiting import wait_for

from jupyter_remote_compute.engines import farside
from jupyter_remote_compute.environments import image as images

# `run` announces itself, takes a second to create the container, and then runs the entry in the
# working directory it was given unless the container was removed meanwhile; `stop` fails while there
# is no container yet (podman: "no such container"); `rm` removes it; `container inspect` finds none
# (the run's --rm removed it). Every call warns first, as rootless podman does without linger.
SLOW_RUNTIME = f"""#!/bin/sh
echo 'WARN[0000] The cgroupv2 manager is set to systemd but there is no systemd user session available' >&2
case $1 in
  --version) echo "fake version 1.0" ;;
  image) case "$*" in *RepoDigests*) ;; *) echo {IMAGE_ID} ;; esac ;;
  run)
    : > "$FAKE_DIR/creating"
    sleep 1
    if [ -e "$FAKE_DIR/removed" ]; then echo "Error: container was removed while it was created" >&2; exit 125; fi
    : > "$FAKE_DIR/created"
    while [ "$1" != --entrypoint ]; do [ "$1" != -w ] || cd "$2"; shift; done
    shift 3
    exec sh "$@" ;;
  stop) [ -e "$FAKE_DIR/created" ] || {{ echo "Error: no container with name or ID found" >&2; exit 125; }} ;;
  rm) : > "$FAKE_DIR/removed" ;;
  container) exit 125 ;;  # inspect once the run ended: its --rm removed it
esac
"""


@pytest.fixture
def job(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A job folder and the environment that puts the slow runtime first on PATH."""
    fake = tmp_path / "bin"
    fake.mkdir()
    _executable(fake / "podman", SLOW_RUNTIME)
    jobdir = tmp_path / "jobs" / "j1"
    (jobdir / "work").mkdir(parents=True)
    return jobdir, {"PATH": f"{fake}:/usr/bin:/bin", "FAKE_DIR": str(fake), "HOME": str(tmp_path)}


def _start(jobdir: Path, env: dict[str, str], command: str) -> subprocess.Popen[str]:
    (jobdir / "command.inner.sh").write_text(command + "\n")
    words = [str(jobdir), str(jobdir.parent / "images"), "localhost/slow:1", "podman", "none"]
    words += [" ".join(images.env_names([])), images.ENTRY_SH, "none"]
    return subprocess.Popen(
        ["sh", "-c", farside.script("container"), "sh", *words],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_term_while_the_container_is_created_stops_the_job_before_its_command(job):
    """The Slurm batch script's trap TERMs container.sh alone, as cancel can come at any moment: the
    stop finds no container yet, so the one being created is removed and the command never runs."""
    jobdir, env = job
    run = _start(jobdir, env, "touch ran; sleep 5")
    fake = Path(env["FAKE_DIR"])
    wait_for(lambda: (fake / "creating").exists(), timeout=30, message="the runtime to be creating the container")
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=30)
    assert run.returncode == 143, err
    assert not (jobdir / "work/ran").exists(), "the command of a stopped job never runs"
    assert (fake / "removed").exists()
    left = {p.name for p in jobdir.iterdir()} & {".container-env", ".container-ran", ".container-err", "container"}
    assert not left, left


def test_a_failed_command_keeps_the_runtimes_warnings_out_of_its_words(job):
    jobdir, env = job
    run = _start(jobdir, env, "echo 'ValueError: the real cause' >&2; exit 3")
    _, err = run.communicate(timeout=60)
    assert run.returncode == 3, err
    assert "cgroupv2 manager" not in err and "cgroupv2 manager" not in (jobdir / "log").read_text()
    assert "ValueError: the real cause" in (jobdir / "log").read_text()
