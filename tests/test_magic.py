"""``%remote_train`` in a real IPython kernel (jupyter_client), on a copy of the quickstart workspace."""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sshd_fixture
from jupyter_client.manager import KernelManager
from mlflow.tracking import MlflowClient
from waiting import wait_for

QUICKSTART_LINE = (
    "%remote_train --machine local --send train.py --send 'data/*.csv' --bring-back model.pkl -- python train.py"
)


class Cell:
    """One execution: its iopub messages as they arrive, and its reply."""

    def __init__(self, kernel: Kernel, msg_id: str) -> None:
        self.kernel = kernel
        self.msg_id = msg_id
        self.messages: list[dict[str, Any]] = []
        self.idle = False
        self.reply: dict[str, Any] = {}

    def until(self, condition: Callable[[Cell], bool], timeout: float = 120, message: str = "output") -> None:
        deadline = time.monotonic() + timeout
        while not condition(self):
            if self.idle and self.reply:
                raise AssertionError(f"the cell ended without {message}:\n{self.stdout}\n{self.stderr}\n{self.error}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {message}:\n{self.stdout}\n{self.stderr}")
            self.kernel.pump(0.2)

    def done(self, timeout: float = 120) -> Cell:
        self.until(lambda c: c.idle and bool(c.reply), timeout, "the cell to finish")
        return self

    def _stream(self, name: str) -> str:
        return "".join(
            m["content"]["text"] for m in self.messages if m["msg_type"] == "stream" and m["content"]["name"] == name
        )

    @property
    def stdout(self) -> str:
        return self._stream("stdout")

    @property
    def stderr(self) -> str:
        return self._stream("stderr")

    @property
    def error(self) -> dict[str, Any] | None:
        """The reply's ename and evalue when the cell failed (a UsageError has no iopub error message)."""
        return self.reply if self.reply.get("status") == "error" else None

    @property
    def result(self) -> dict[str, Any] | None:
        results = [m["content"]["data"] for m in self.messages if m["msg_type"] == "execute_result"]
        return results[0] if results else None


class Kernel:
    """A started kernel; its messages are routed to the cell (execution) they belong to."""

    def __init__(self, manager: KernelManager) -> None:
        self.manager = manager
        self.client = manager.client()
        self.cells: dict[str, Cell] = {}

    def submit(self, code: str) -> Cell:
        cell = Cell(self, self.client.execute(code))
        self.cells[cell.msg_id] = cell
        return cell

    def run(self, code: str, timeout: float = 120) -> Cell:
        return self.submit(code).done(timeout)

    def pump(self, timeout: float) -> None:
        for get, channel in ((self.client.get_iopub_msg, "iopub"), (self.client.get_shell_msg, "shell")):
            try:
                msg = get(timeout=timeout if channel == "iopub" else 0.01)
            except queue.Empty:
                continue
            cell = self.cells.get(msg["parent_header"].get("msg_id"))
            if cell is None:
                continue
            if channel == "shell":
                cell.reply = msg["content"]
            else:
                cell.messages.append(msg)
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    cell.idle = True


@pytest.fixture
def kernel(quickstart: Path, scratch_dir: Path, tracking_uri: str) -> Iterator[Kernel]:
    env = {
        **os.environ,
        "JUPYTER_REMOTE_COMPUTE_SCRATCH": str(scratch_dir),
        "MLFLOW_TRACKING_URI": tracking_uri,
        "PYTHON_KEYRING_BACKEND": os.environ["PYTHON_KEYRING_BACKEND"],
        "XDG_DATA_HOME": os.environ["XDG_DATA_HOME"],
    }
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(quickstart), env=env)
    kernel = Kernel(manager)
    kernel.client.start_channels()
    try:
        kernel.client.wait_for_ready(timeout=60)
        loaded = kernel.run("%load_ext jupyter_remote_compute")
        assert loaded.error is None, loaded.error
        yield kernel
    finally:
        kernel.client.stop_channels()
        manager.shutdown_kernel(now=True)


def _running(service: Any) -> list:
    return [j for j in service.list_jobs() if j.state == "running"]


def recorded_run(kernel: Kernel) -> str:
    """The job's MLflow run id once the detached recorder has written it onto the job."""

    def run_id() -> str | None:
        out = kernel.run("print(job.mlflow_run_id)").stdout.strip()
        return None if out == "None" else out

    return wait_for(run_id, timeout=120, message="the job's MLflow run to be recorded")


def test_quickstart_streams_the_log_lands_the_model_and_returns_a_rich_job(
    kernel, quickstart: Path, tracking_uri: str
) -> None:
    cell = kernel.run(f"job = {QUICKSTART_LINE}\njob")
    assert cell.error is None, cell.error
    assert "submitted job" in cell.stdout
    assert "trained on 40 rows" in cell.stdout  # the live log
    final = cell.stdout.strip().splitlines()[-1]
    assert "succeeded after" in final and "outputs: model.pkl" in final and "MLflow run" in final
    # MLflow stayed out of the kernel: a detached recorder records the run after the job ended.
    assert kernel.run("import sys; print('mlflow' in sys.modules)").stdout.strip() == "False"
    run_id = recorded_run(kernel)
    job_id = kernel.run("print(job.id)").stdout.strip()
    client = MlflowClient(tracking_uri)
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], f"tags.`remote_compute.job_id` = '{job_id}'"
    )
    assert [r.info.run_id for r in runs] == [run_id]  # exactly one run for the job
    # MLflow's UI opens it as a training run, not on its GenAI view.
    assert client.get_experiment(runs[0].info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    # Its artifacts are in the workspace, not in the kernel's working directory.
    assert runs[0].info.artifact_uri.startswith(quickstart.as_uri()), runs[0].info.artifact_uri
    # The transfer bar is output, not an error: a notebook draws stderr in a pink box.
    assert "sending to local" in cell.stdout and "sending to local" not in cell.stderr
    assert (quickstart / "model.pkl").is_file()
    html = cell.result["text/html"]
    assert "succeeded" in html and "model.pkl" in html and "local" in html
    assert "<RemoteTrainJob" in cell.result["text/plain"]

    outputs = kernel.run("print(sorted(job.outputs), job.mlflow_run_id is not None, job.trained)")
    assert "['model.pkl'] True True" in outputs.stdout


def test_interrupt_detaches_and_running_the_cell_again_attaches(kernel, quickstart: Path, make_service) -> None:
    go = quickstart.parent / "go"
    line = f"%remote_train --send train.py -- sh -c 'echo up; while [ ! -f {go} ]; do sleep 0.05; done; echo done'"
    service = make_service(quickstart)

    first = kernel.submit(line)
    first.until(lambda c: "up" in c.stdout.split(), message="the job's log")
    kernel.manager.interrupt_kernel()
    first.done()

    assert first.error is not None and first.error["ename"] == "KeyboardInterrupt"
    [job] = service.list_jobs()
    assert f"detached from job {job.id}; it keeps running" in first.stderr
    assert f"%remote_jobs --cancel {job.id}" in first.stderr and "run the cell again" in first.stderr
    # The job is not stopped by the interrupt: it is still running on its own.
    assert service.get(job.id).state == "running"

    second = kernel.submit(line)
    second.until(lambda c: f"attached to running job {job.id}" in c.stdout, message="attaching")
    go.touch()
    second.done()
    assert second.error is None, second.error
    assert "done" in second.stdout.split()
    assert [j.id for j in service.list_jobs()] == [job.id]
    assert service.get(job.id).state == "succeeded"


def test_running_the_cell_again_shows_a_job_that_ended_while_detached(kernel, quickstart: Path, make_service) -> None:
    go = quickstart.parent / "go"
    line = f"%remote_train --send train.py -- sh -c 'echo up; while [ ! -f {go} ]; do sleep 0.05; done; echo done'"
    first = kernel.submit(line)
    first.until(lambda c: "up" in c.stdout.split(), message="the job's log")
    kernel.manager.interrupt_kernel()
    first.done()
    # Someone else (the server's poller, the CLI) sees it through to the end meanwhile.
    service = make_service(quickstart)
    [job] = service.list_jobs()
    go.touch()
    assert service.wait(job.id, timeout=120).state == "succeeded"

    second = kernel.run(f"job = {line}\nprint(job.log())")
    assert second.error is None, second.error
    assert f"job {job.id} on local ended while detached" in second.stdout
    assert f"job {job.id} on local: succeeded" in second.stdout
    assert second.stdout.split().count("done") == 2  # streamed, then job.log()
    assert [j.id for j in service.list_jobs()] == [job.id]


def test_a_failing_command_raises_not_trained_with_its_reason(kernel) -> None:
    cell = kernel.submit("%remote_train -- sh -c 'echo boom >&2; exit 4'")
    queued = kernel.submit("print('the next cell ran')")  # as "Run All" queues it
    cell.done()
    queued.done()
    assert cell.error is not None
    assert cell.error["ename"] == "NotTrained"
    assert "exit code 4" in cell.error["evalue"] and "boom" in cell.error["evalue"]
    assert "failed after" in cell.stdout
    assert "exit code 4" not in cell.stdout  # the reason is told once, by the error
    assert queued.reply["status"] == "aborted" and "the next cell ran" not in queued.stdout


def test_the_command_after_dashes_runs_in_the_machines_shell_as_written(kernel, make_service, quickstart) -> None:
    """One rule with the New Job form and a pipeline step: the line after -- is the shell's, && and quotes
    included, and the job's spec holds it as written (what its detail shows)."""
    line = """%remote_train -- echo "a  b" && echo 'second' | tr a-z A-Z"""
    cell = kernel.run(line)
    assert cell.error is None, (cell.error, cell.stdout)
    assert "a  b" in cell.stdout and "SECOND" in cell.stdout
    [job] = make_service(quickstart).list_jobs()
    assert job.spec.command == """echo "a  b" && echo 'second' | tr a-z A-Z"""


def test_remote_train_names_a_pool_where_it_names_a_machine(kernel, make_service, quickstart) -> None:
    from jupyter_remote_compute.schema.pool import PoolInput

    service = make_service(quickstart)
    service.machines.put_pool("here", PoolInput.from_json({"machines": ["local"]}))
    cell = kernel.run("%remote_train --machine here -- echo pooled")
    assert cell.error is None, (cell.error, cell.stdout)
    assert "on local (placed on local: first with room)" in cell.stdout and "pooled" in cell.stdout
    [job] = service.list_jobs()
    assert (job.state, job.pool, job.machine) == ("succeeded", "here", "local")


def test_a_cell_body_runs_as_the_script_and_running_it_again_attaches(kernel, quickstart: Path, make_service) -> None:
    go = quickstart.parent / "go-cell"
    body = (
        "import csv, os, time\n"
        "rows = list(csv.DictReader(open('data/points.csv')))\n"
        "print('rows', len(rows), flush=True)\n"
        f"while not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.05)\n"
        "open('count.txt', 'w').write(str(len(rows)))\n"
    )
    code = "%%remote_train --send data/points.csv --bring-back count.txt\n" + body
    service = make_service(quickstart)

    first = kernel.submit(code)
    first.until(lambda c: "rows 40" in c.stdout, message="the script's output")
    kernel.manager.interrupt_kernel()
    first.done()
    [job] = service.list_jobs()

    second = kernel.submit(code)
    second.until(lambda c: f"attached to running job {job.id}" in c.stdout, message="attaching")
    go.touch()
    second.done()
    assert second.error is None, second.error
    assert (quickstart / "count.txt").read_text() == "40"
    script = job.spec.command.split()[1]
    assert script.startswith(".remote-compute-cells/") and (quickstart / script).read_text() == body
    assert not list((quickstart / ".punica").rglob("*.py"))  # never written into .punica
    assert (quickstart / ".remote-compute-cells" / ".gitignore").read_text() == "*\n"


def test_remote_jobs_lists_and_cancels(kernel, quickstart: Path, make_service) -> None:
    service = make_service(quickstart)
    started = kernel.run("job = %remote_train --detach --send train.py -- sh -c 'echo up; sleep 300'")
    assert started.error is None, started.error
    [job] = wait_for(lambda: _running(service), message="the job to run")

    table = kernel.run("%remote_jobs")
    assert job.id in table.result["text/html"] and "running" in table.result["text/plain"]

    cancelled = kernel.run(f"%remote_jobs --cancel {job.id}")
    assert cancelled.error is None, cancelled.error
    assert service.get(job.id).state == "cancelled"
    assert "cancelled" in cancelled.result["text/html"]


def test_help_shows_the_options_with_examples(kernel) -> None:
    cell = kernel.run("%remote_train?")
    pages = [p for p in cell.reply.get("payload", []) if p.get("source") == "page"]
    text = pages[0]["data"]["text/plain"]
    assert "--bring-back" in text and "--wait" in text and "examples:" in text and "%%remote_train" in text
    assert "as in the New Job form" in text and "New job" not in text  # the panel's name for it


def test_bad_options_are_a_usage_error(kernel) -> None:
    cell = kernel.run("%remote_train --send ../outside -- true")
    assert cell.error["ename"] == "InvalidSettings" and "send[0]" in cell.error["evalue"]
    cell = kernel.run("%remote_train --bogus -- true")
    assert cell.error["ename"] == "UsageError" and "--bogus" in cell.error["evalue"]


def test_image_and_runtime_fill_the_jobs_environment(kernel, quickstart: Path, make_service) -> None:
    """--image reaches the job as environment.image: an agent machine, which runs no image, refuses it by
    that name at submit; a runtime with no image is refused naming environment.runtime."""
    make_service(quickstart).machines.add("lab", "agent", "lab.lab")
    cell = kernel.run("%remote_train --machine lab --image python:3.12 --runtime podman --requirements r.txt -- true")
    assert cell.error["ename"] == "InvalidSettings", cell.error
    # agents run images; one that never connected cannot say which runtimes it has
    assert "environment.image: could not learn whether lab runs images" in cell.error["evalue"], cell.error
    cell = kernel.run("%remote_train --image 'x;y' -- true")
    assert cell.error["ename"] == "InvalidSettings" and "environment.image" in cell.error["evalue"]
    cell = kernel.run("%remote_train --runtime docker -- true")
    assert cell.error["ename"] == "InvalidSettings" and "environment.runtime" in cell.error["evalue"]
    assert make_service(quickstart).list_jobs() == [], "nothing is stored for a refused job"


# -- the same magic on an SSH machine: a real sshd and ssh-agent on loopback ----------------------
sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env


def test_remote_train_on_an_ssh_machine(
    ssh_agent_env, kernel: Kernel, quickstart: Path, make_service, tracking_uri: str
) -> None:
    """The quickstart, logging to MLflow on the far side, trained from a notebook on an SSH machine."""
    make_service(quickstart).machines.add("box", "ssh", "127.0.0.1", ssh_agent_env.options())
    (quickstart / "job.sh").write_text('echo "on $(uname -n) as $(id -un)"; python train.py\n')
    cell = kernel.run(
        "job = %remote_train --machine box --send job.sh --send train.py --send 'data/*.csv' "
        "--bring-back model.pkl -- sh job.sh"
    )
    assert cell.error is None, (cell.error, cell.stderr)
    assert f"as {ssh_agent_env.user}" in cell.stdout
    assert "trained on 40 rows" in cell.stdout
    assert (quickstart / "model.pkl").is_file()
    # The run id first: a client opened on the fresh store while the recorder creates it would race
    # MLflow's own table creation (outside the recorder's store lock).
    run_id = recorded_run(kernel)
    run = MlflowClient(tracking_uri).get_run(run_id)
    assert run.data.params["rows"] == "40" and run.data.tags["remote_compute.engine"] == "ssh"
    assert run.info.artifact_uri.startswith(quickstart.as_uri()), run.info.artifact_uri


def test_remote_train_prints_the_latest_metrics_under_the_log_while_the_job_runs(
    kernel, quickstart: Path, scratch_dir: Path
) -> None:
    from test_live_metrics import TRAIN

    (quickstart / "live.py").write_text(TRAIN)
    cell = kernel.submit("%remote_train --send live.py -- python live.py")
    # Printed while the job still waits for its go file: live, not replayed at the end.
    cell.until(lambda c: "loss 0.333333 (step 2)" in c.stdout, timeout=180, message="the live metrics line")
    assert "acc/top 1 0.5 (step 0)" in cell.stdout and "[metrics]" in cell.stdout
    assert "trained" not in cell.stdout
    [jobdir] = [d for d in scratch_dir.iterdir() if (d / "work/live.py").exists()]
    (jobdir / "work" / "go").write_text("")
    cell.done(180)
    assert cell.error is None, cell.error
    lines = cell.stdout.splitlines()
    # The last point comes after the log it followed, in the same stream.
    assert any("loss 0.125 (step 3)" in line for line in lines[lines.index("trained") :])


def test_a_sweep_runs_each_trial_prints_its_state_and_fails_naming_the_trial(kernel, quickstart: Path) -> None:
    cell = kernel.run("%remote_train --sweep x=1,2 --bring-back 'out-{x}.txt' -- echo {x} > out-{x}.txt")
    assert cell.error is None, (cell.error, cell.stdout)
    assert "sweep x: 2 trials, 4 at once" in cell.stdout and "trial-2 (x=2): succeeded" in cell.stdout
    assert (quickstart / "out-1.txt").read_text() == "1\n" and (quickstart / "out-2.txt").read_text() == "2\n"
    failing = kernel.run("%remote_train --sweep x=0,5 -- exit {x}")
    assert failing.error is not None and failing.error["ename"] == "RemoteComputeError"
    assert "1 of 2 trials succeeded; trial-2 (x=5) failed: exit code 5" in failing.error["evalue"]
    detached = kernel.run("%remote_train --sweep x=1 --detach -- echo {x}")
    assert detached.error is not None and "--detach: a sweep is driven by this cell" in detached.error["evalue"]


def test_a_jobs_wait_in_the_notebook_draws_its_transfer_bar_as_output_not_as_an_error(
    kernel, make_service, quickstart
) -> None:
    """``job.wait()`` follows in the notebook as the magic does: stderr is drawn in a pink box there."""
    from jupyter_remote_compute.jobs.spec import JobSpec

    spec = JobSpec.from_json({"command": "python train.py", "send": ["train.py", "data/*.csv"]})
    job = make_service(quickstart).submit(spec).job  # queued: the notebook's wait sends it
    waited = kernel.run(f"job = %remote_jobs {job.id}\njob.wait()")
    assert waited.error is None, waited.error
    assert "sending to local" in waited.stdout and "sending to local" not in waited.stderr, waited.stderr
    assert "trained on 40 rows" in waited.stdout
