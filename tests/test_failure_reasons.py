"""A failed job's reason, as `jobs list --json` shows it: the log's line that says why, on local and ssh.

Real jobs on the built-in machine and over the loopback sshd fail for real (a traceback, a missing
input, an environment that cannot be built, a notebook cell); the reason is read back through the CLI
in a real subprocess, as a user reads it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import package_index
import pytest
import sshd_fixture
from test_notebook import make_notebook

from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.pipelines.notebook import notebook_spec

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env
index = package_index.index

#: Fails two calls deep, and chained: the exception raised last is the one that says why.
CHAINED = """\
def divide(a, b):
    return a / b

def fit():
    try:
        divide(3, 0)
    except ZeroDivisionError as e:
        raise RuntimeError("could not divide 3 by zero") from e

fit()
"""

#: Prints the secret with a colour code inside it, where the log's masking cannot see it; the reason's must.
LEAK = r"""rest=${TOKEN#??????}
head=${TOKEN%"$rest"}
printf '\033[1;31mdenied\033[0m for \033]0;title\007%s\033[0m%s\n' "$head" "$rest" >&2
exit 3
"""


@pytest.fixture(params=["local", "ssh"])
def bench(request, workspace: Path, make_service, index):  # type: ignore[no-untyped-def]
    """(service, machine name): the built-in machine, or the loopback sshd as machine ``box``; both
    build environments from the test's package index."""
    service = make_service(workspace)
    if request.param == "local":
        return service, "local"
    bed = request.getfixturevalue("ssh_agent_env")
    service.machines.add("box", "ssh", "127.0.0.1", bed.options(ssh_transport="openssh", index_url=index.url))
    return service, "box"


def cli(workspace: Path, tracking_uri: str, *args: str) -> str:
    """What `jupyter remote-compute ARGS` prints, run in the workspace."""
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_remote_compute.cli", *args],
        cwd=workspace,
        env={**os.environ, "MLFLOW_TRACKING_URI": tracking_uri},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def listed_reason(workspace: Path, job_id: str, tracking_uri: str) -> str:
    """The job's reason in `jupyter remote-compute jobs list --json`."""
    (job,) = [j for j in json.loads(cli(workspace, tracking_uri, "jobs", "list", "--json")) if j["id"] == job_id]
    assert job["state"] == "failed"
    return job["reason"]


def _run(service, spec: JobSpec) -> str:  # type: ignore[no-untyped-def]
    job = service.wait(service.submit(spec).job.id, timeout=300)
    assert job.state == "failed", job.reason
    return job.id


def test_a_traceback_s_reason_is_the_exception_raised_last(bench, workspace, tracking_uri):
    service, machine = bench
    (workspace / "fit.py").write_text(CHAINED)
    job_id = _run(
        service, JobSpec.from_json({"machine": machine, "command": ["python3", "fit.py"], "send": ["fit.py"]})
    )
    assert listed_reason(workspace, job_id, tracking_uri) == "exit code 1: RuntimeError: could not divide 3 by zero"


def test_a_workspace_file_the_job_did_not_send_is_named_with_how_to_send_it(bench, workspace, tracking_uri):
    service, machine = bench
    (workspace / "fit.py").write_text("open('data.csv').read()\n")
    (workspace / "data.csv").write_text("x,y\n1,2\n")
    job_id = _run(
        service, JobSpec.from_json({"machine": machine, "command": ["python3", "fit.py"], "send": ["fit.py"]})
    )
    assert listed_reason(workspace, job_id, tracking_uri) == (
        "exit code 1: FileNotFoundError: [Errno 2] No such file or directory: 'data.csv'; "
        "data.csv is in the workspace but was not sent: send it with the job (--send data.csv)"
    )


def test_a_file_missing_from_the_workspace_too_gets_no_hint(bench, workspace, tracking_uri):
    service, machine = bench
    (workspace / "fit.py").write_text("open('data.csv').read()\n")
    job_id = _run(
        service, JobSpec.from_json({"machine": machine, "command": ["python3", "fit.py"], "send": ["fit.py"]})
    )
    assert listed_reason(workspace, job_id, tracking_uri) == (
        "exit code 1: FileNotFoundError: [Errno 2] No such file or directory: 'data.csv'"
    )


def test_terminal_codes_are_taken_out_and_a_secret_printed_between_them_stays_hidden(bench, workspace, tracking_uri):
    service, machine = bench
    value = "tok-" + os.urandom(12).hex()
    service.secrets.set("reasons/token", value)
    (workspace / "leak.sh").write_text(LEAK)
    spec = JobSpec.from_json(
        {
            "machine": machine,
            "command": ["sh", "leak.sh"],
            "send": ["leak.sh"],
            "env": {"TOKEN": "secret:reasons/token"},
        }
    )
    job_id = _run(service, spec)
    assert listed_reason(workspace, job_id, tracking_uri) == "exit code 3: denied for " + "*" * len(value)


def test_an_unresolvable_requirement_s_reason_is_the_installer_s_error(bench, workspace, tracking_uri, index):
    service, machine = bench
    (workspace / "fit.py").write_text("print('never')\n")
    (workspace / "requirements.txt").write_text(f"# {uuid.uuid4()}\nrcdemo-a==9.9\n")
    env = {"UV_DEFAULT_INDEX": index.url, "UV_CACHE_DIR": str(index.uv_cache)} if machine == "local" else {}
    spec = JobSpec.from_json(
        {"machine": machine, "command": ["python", "fit.py"], "send": ["fit.py"], "env": env,
         "environment": {"requirements": "requirements.txt"}}
    )  # fmt: skip
    job_id = _run(service, spec)
    log = service.read_log(job_id).data.decode()
    (short,) = set(re.findall(r"^environment (\w+): building with", log, re.M))
    # uv on both: this side's on the built-in machine, sent along to the ssh machine (it has none)
    why = (
        "No solution found when resolving dependencies: Because there is no version of rcdemo-a==9.9 and "
        "you require rcdemo-a==9.9, we can conclude that your requirements are unsatisfiable."
    )
    assert (
        listed_reason(workspace, job_id, tracking_uri)
        == f"exit code 95: environment {short}: could not be built: {why}"
    )


def test_a_failing_notebook_cell_s_reason_is_the_runner_s_summary(workspace, make_service, tracking_uri):
    # the kernel colours its traceback: raw terminal codes would lead the log's last lines
    make_notebook(workspace / "broken.ipynb", third="print('before')\n1 / 0")
    service = make_service(workspace)
    spec, _ = notebook_spec({"notebook": "broken.ipynb", "python": sys.executable})
    job_id = _run(service, spec)
    assert "\x1b[" in service.read_log(job_id).data.decode()
    reason = "exit code 1: run-notebook: broken.ipynb: cell 3 failed: ZeroDivisionError: division by zero"
    assert listed_reason(workspace, job_id, tracking_uri) == reason
    # the table's REASON column shows it whole
    assert cli(workspace, tracking_uri, "jobs", "list").splitlines()[1].endswith(f"  {reason}")
