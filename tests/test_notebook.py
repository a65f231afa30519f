"""Notebooks as jobs: executed on the machine with nbclient and a real kernel, on ``local`` and over ssh.

The far side runs the product's runner (``pipelines/farside/run_notebook.py``) with its own python;
parameters go in after the cell tagged ``parameters``, typed as papermill types them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import nbformat
import pytest
import sshd_fixture
from far_python import venv_with
from filelock import FileLock
from mlflow.tracking import MlflowClient

from jupyter_remote_compute.errors import InvalidSettings
from jupyter_remote_compute.pipelines import notebook_spec, parse_parameters, typed_parameter

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env

DEBIAN_PYTHON = "/usr/bin/python3"
FAR_ROOT = Path("/var/tmp/jrc-far-python")


def make_notebook(path: Path, third: str = "open('result.txt', 'w').write(f'{epochs} {lr}')") -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Train"),
        nbformat.v4.new_code_cell(
            "epochs = 1\nlr = 0.1\nflag = False\nname = 'none'", metadata={"tags": ["parameters"]}
        ),
        nbformat.v4.new_code_cell(third),
        nbformat.v4.new_code_cell("print(type(epochs).__name__, type(lr).__name__, type(flag).__name__, name)"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def outputs_text(cell: dict) -> str:
    return "".join(o.get("text", "") + o.get("evalue", "") for o in cell.get("outputs", []))


def test_parameters_are_typed_as_papermill_types_them() -> None:
    assert typed_parameter("7") == 7 and isinstance(typed_parameter("7"), int)
    assert typed_parameter("0.01") == 0.01 and isinstance(typed_parameter("0.01"), float)
    assert typed_parameter("true") is True and typed_parameter("False") is False
    assert typed_parameter("None") is None
    assert typed_parameter("adam") == "adam" and typed_parameter("1e-3") == 0.001
    assert parse_parameters(["epochs=3", "opt=a=b"]) == {"epochs": 3, "opt": "a=b"}
    with pytest.raises(InvalidSettings, match="parameters: '3x=1'"):
        parse_parameters(["3x=1"])


def test_a_notebook_step_never_overwrites_its_notebook() -> None:
    with pytest.raises(InvalidSettings, match="executed: must differ"):
        notebook_spec({"notebook": "a.ipynb", "executed": "a.ipynb"})
    with pytest.raises(InvalidSettings, match=r"notebook: give the workspace path of a \.ipynb"):
        notebook_spec({"notebook": "a.py"})
    spec, _ = notebook_spec({"notebook": "nb/a.ipynb", "send": ["data/"]})
    assert list(spec.send) == ["nb/a.ipynb", "data"]
    assert list(spec.bring_back) == ["nb/a.executed.ipynb"]


def test_run_notebook_executes_it_with_typed_parameters_and_brings_it_back(workspace, scratch_dir, tracking_uri):
    make_notebook(workspace / "train.ipynb")
    before = (workspace / "train.ipynb").read_bytes()
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "JUPYTER_REMOTE_COMPUTE_SCRATCH": str(scratch_dir)}
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_remote_compute.cli", "run", "--notebook", "train.ipynb",
         "-p", "epochs=3", "-p", "lr=0.01", "-p", "flag=true", "-p", "name=adam",
         "--python", sys.executable, "--bring-back", "result.txt"],
        cwd=workspace, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (workspace / "train.ipynb").read_bytes() == before  # the notebook itself is never changed
    assert (workspace / "result.txt").read_text() == "3 0.01"
    executed = nbformat.read(workspace / "train.executed.ipynb", as_version=4)
    tags = [c.metadata.get("tags", []) for c in executed.cells]
    assert tags[1] == ["parameters"] and tags[2] == ["injected-parameters"]  # right after the tagged cell
    assert "epochs = 3\nflag = True\nlr = 0.01\nname = 'adam'" in executed.cells[2].source  # sorted: one key
    assert outputs_text(executed.cells[-1]).strip() == "int float bool adam"


def test_a_notebook_in_an_image_alone_is_given_no_runner_packages():
    """An image alone builds nothing: a notebook image's own nbclient is used, not installed again;
    with packages beside it, the runner's are added as for any environment (tests/test_containers.py
    runs both in a real image)."""
    alone, _ = notebook_spec({"notebook": "train.ipynb", "environment": {"image": "jupyter/base-notebook:1"}})
    assert alone.image is not None and alone.image.ref == "jupyter/base-notebook:1"
    assert alone.environment is not None and alone.environment.packages == ()
    on_top, _ = notebook_spec({"notebook": "train.ipynb", "environment": {"image": "x:1", "packages": ["numpy"]}})
    assert on_top.environment is not None and on_top.environment.packages == ("numpy", "nbclient", "ipykernel")


def test_a_failing_third_cell_fails_the_job_with_that_cell_and_the_notebook_comes_back(
    workspace, make_service, tracking_uri
):
    make_notebook(workspace / "train.ipynb", third="print('before the error')\nraise ValueError('boom')")
    service = make_service(workspace)
    spec, _ = notebook_spec({"notebook": "train.ipynb", "parameters": {"epochs": 2}, "python": sys.executable})
    job = service.wait(service.submit(spec).job.id, timeout=300)
    assert job.state == "failed"
    assert "exit code 1" in job.reason and "train.ipynb: cell 3 failed: ValueError: boom" in job.reason, job.reason
    # A failed job brings no outputs into the workspace; the executed notebook is an artifact of its run.
    assert not (workspace / "train.executed.ipynb").exists()
    client = MlflowClient(tracking_uri)
    assert [a.path for a in client.list_artifacts(job.mlflow_run_id, "notebook")] == ["notebook/train.executed.ipynb"]
    local = client.download_artifacts(job.mlflow_run_id, "notebook/train.executed.ipynb", str(workspace / "dl"))
    executed = nbformat.read(local, as_version=4)
    failing = executed.cells[3]  # the notebook's third cell, after the injected one
    assert "raise ValueError" in failing.source and "before the error" in outputs_text(failing)
    assert any(o.get("ename") == "ValueError" for o in failing.outputs)
    assert executed.cells[4].get("outputs") == []  # nothing ran after it


def test_a_python_without_nbclient_fails_saying_what_to_install(workspace, make_service):
    probe = subprocess.run([DEBIAN_PYTHON, "-c", "import nbclient"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{DEBIAN_PYTHON} has nbclient: no python without it to try")
    make_notebook(workspace / "train.ipynb")
    service = make_service(workspace)
    spec, _ = notebook_spec({"notebook": "train.ipynb", "python": DEBIAN_PYTHON})
    job = service.wait(service.submit(spec).job.id, timeout=120)
    assert job.state == "failed" and "exit code 3" in job.reason
    assert "lacks nbformat, nbclient, ipykernel" in job.reason and "-m pip install nbclient ipykernel" in job.reason


def far_notebook_python() -> Path:
    """A python the ssh test user may run, with nbclient, ipykernel and MLflow at this side's versions."""
    pins = [f"{name}=={version(name)}" for name in ("nbclient", "ipykernel")] + [f"mlflow-skinny=={version('mlflow')}"]
    home = FAR_ROOT / ("notebook-" + "-".join(p.replace("==", "") for p in pins))
    python = home / "bin" / "python"
    FAR_ROOT.mkdir(mode=0o755, exist_ok=True)
    with FileLock(str(FAR_ROOT / ".build.lock"), timeout=600):
        if not python.exists():
            venv_with(home, pins)
    return python


def test_a_notebook_runs_over_ssh_with_a_real_kernel(workspace, make_service, ssh_agent_env, tracking_uri):
    python = far_notebook_python()
    make_notebook(workspace / "train.ipynb")
    service = make_service(workspace)
    service.machines.add("box", "ssh", "127.0.0.1", ssh_agent_env.options())
    spec, _ = notebook_spec(
        {"machine": "box", "notebook": "train.ipynb", "parameters": {"epochs": 5, "lr": 0.5}, "python": str(python),
         "bring_back": ["result.txt"]}
    )  # fmt: skip
    job = service.wait(service.submit(spec).job.id, timeout=300)
    assert job.state == "succeeded", job.reason
    assert (workspace / "result.txt").read_text() == "5 0.5"
    executed = nbformat.read(workspace / "train.executed.ipynb", as_version=4)
    assert outputs_text(executed.cells[-1]).strip() == "int float bool none"
    assert set(job.outputs) == {"train.executed.ipynb", "result.txt"}
    assert json.loads((workspace / "train.executed.ipynb").read_text())["cells"][2]["metadata"]["tags"] == [
        "injected-parameters"
    ]


def test_a_notebook_node_in_a_pipeline_reads_what_the_node_before_brought_back(workspace, make_service):
    from importlib.metadata import entry_points
    from pkgutil import resolve_name

    from jupyter_remote_compute.pipelines.runner import PipelineRunner
    from jupyter_remote_compute.steps import run_notebook_step

    [entry] = [ep for ep in entry_points(group="punica.mlops.steps") if ep.name == "run-notebook-on-remote-machine"]
    assert resolve_name(entry.load()["executor"]) is run_notebook_step
    make_notebook(workspace / "report.ipynb", third="open('result.txt', 'w').write(open('data.txt').read() * epochs)")
    document = {
        "version": 1,
        "nodes": [
            {"id": "prepare", "step": "train-on-remote-machine",
             "settings": {"command": [sys.executable, "-c", "open('data.txt', 'w').write('ab')"],
                          "bring_back": ["data.txt"]}},
            {"id": "report", "step": "run-notebook-on-remote-machine",
             "settings": {"notebook": "report.ipynb", "parameters": {"epochs": 2}, "python": sys.executable,
                          "bring_back": ["result.txt"]}},
        ],
        "edges": [{"from": "prepare", "to": "report"}],
    }  # fmt: skip
    (workspace / "report.rcpipeline").write_text(json.dumps(document))
    runner = PipelineRunner(make_service(workspace))
    try:
        run, _ = runner.start("report.rcpipeline", background=False)
        run = runner.drive(run.id)
    finally:
        runner.close()
    assert run.state == "succeeded", run.to_json()
    assert (workspace / "result.txt").read_text() == "abab"
    assert set(run.nodes["report"].outputs) == {"report.executed.ipynb", "result.txt"}
