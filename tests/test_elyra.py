"""Elyra's pipelines on the machines: real Elyra in a venv of its own (tests/elyra_venv.py), a real
`jupyter server` from it."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from elyra_venv import build_elyra_venv, venv_folder
from required import require
from server_process import Server
from waiting import wait_for

#: The first node waits for a file the test writes (given by its absolute path: the job runs elsewhere).
FIRST = (
    "import pathlib, sys, time\n"
    "while not pathlib.Path({gate!r}).exists(): time.sleep(0.05)\n"
    "pathlib.Path('data.txt').write_text('42')\n"
)
SECOND = (
    "import os, pathlib\n"
    "pathlib.Path('result.txt').write_text(pathlib.Path('data.txt').read_text() + os.environ['SUFFIX'])\n"
)


@pytest.fixture(scope="session")
def elyra_python() -> Path:
    python, how = build_elyra_venv(venv_folder())
    require(python is not None, f"a venv with Elyra ({how})")
    assert python is not None
    print(f"Elyra venv: {how}")
    return python


@pytest.fixture
def elyra_server(elyra_python: Path, tmp_path: Path, scratch_dir: Path, tracking_uri: str) -> Iterator[Server]:
    root = tmp_path / "ws"
    (root / ".punica").mkdir(parents=True)
    (root / "first.py").write_text(FIRST.format(gate=str(tmp_path / "release")))
    (root / "second.py").write_text(SECOND)
    # Elyra keeps its runtime configurations in the Jupyter data folder: this test's own.
    env = {
        **os.environ,
        "JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"),
    }
    srv = Server(
        root,
        scratch_dir,
        tracking_uri,
        tmp_path / "server.log",
        env=env,
        python=str(elyra_python),
        extra_args=("--ServerApp.jpserver_extensions=elyra=True",),
    )
    srv.start()
    yield srv
    srv.stop()


def runtimes(srv: Server) -> dict[str, dict[str, Any]]:
    answer = srv.request_at("GET", "/elyra/metadata/runtimes")
    return {r["name"]: r for r in answer["runtimes"] if r["schema_name"] == "remote_compute"}


def node(node_id: str, filename: str, *, parents: list[str], **parameters: Any) -> dict[str, Any]:
    return {
        "id": node_id,
        "type": "execution_node",
        "op": "execute-notebook-node" if filename.endswith(".ipynb") else "execute-python-node",
        "app_data": {
            "component_parameters": {
                "filename": filename,
                "runtime_image": "library/python:3.11",  # Elyra's validation needs one; Remote Compute ignores it
                "dependencies": [],
                "include_subdirectories": False,
                "outputs": [],
                "env_vars": [],
                **parameters,
            },
            "label": Path(filename).name,
            "ui_data": {"label": Path(filename).name, "x_pos": 0, "y_pos": 0},
        },
        "inputs": [
            {
                "id": "inPort",
                "app_data": {"ui_data": {"cardinality": {"min": 0, "max": -1}, "label": "Input Port"}},
                "links": [{"id": str(uuid.uuid4()), "node_id_ref": p, "port_id_ref": "outPort"} for p in parents],
            }
        ],
        "outputs": [
            {"id": "outPort", "app_data": {"ui_data": {"cardinality": {"min": 0, "max": -1}, "label": "Output Port"}}}
        ],
    }


def two_node_pipeline(first: str, second: str, second_file: str = "second.py") -> dict[str, Any]:
    return {
        "doc_type": "pipeline",
        "version": "3.0",
        "json_schema": "http://api.dataplatform.ibm.com/schemas/common-pipeline/pipeline-flow/pipeline-flow-v3-schema.json",
        "id": str(uuid.uuid4()),
        "primary_pipeline": "primary",
        "pipelines": [
            {
                "id": "primary",
                "nodes": [
                    node(first, "first.py", parents=[], outputs=["data.txt"]),
                    node(
                        second,
                        second_file,
                        parents=[first],
                        outputs=["result.txt"],
                        env_vars=[{"env_var": "SUFFIX", "value": "!"}],
                    ),
                ],
                "app_data": {
                    "name": "flow",
                    "runtime": "remote_compute",
                    "runtime_config": "rc-local",
                    "runtime_type": "LOCAL",
                    "source": "flow.pipeline",
                    "version": 8,
                    "properties": {"name": "flow", "runtime": "Remote Compute"},
                    "ui_data": {"comments": []},
                },
                "runtime_ref": "",
            }
        ],
        "schemas": [],
    }


def test_machines_are_runtime_configurations_kept_in_step(elyra_server: Server) -> None:
    wait_for(lambda: "rc-local" in runtimes(elyra_server), timeout=60, interval=0.2, message="rc-local")
    assert runtimes(elyra_server)["rc-local"]["metadata"]["machine"] == "local"
    assert runtimes(elyra_server)["rc-local"]["metadata"]["runtime_type"] == "LOCAL"

    elyra_server.request("POST", "machines", {"name": "gpu-box", "kind": "agent", "address": "gpu-box.lab"})
    wait_for(lambda: "rc-gpu-box" in runtimes(elyra_server), timeout=60, interval=0.2, message="rc-gpu-box")
    assert runtimes(elyra_server)["rc-gpu-box"]["metadata"]["machine"] == "gpu-box"

    elyra_server.request("DELETE", "machines/gpu-box")
    wait_for(lambda: "rc-gpu-box" not in runtimes(elyra_server), timeout=60, interval=0.2, message="removal")
    assert "rc-local" in runtimes(elyra_server)


def succeeded_run(server: Server, run_id: str) -> dict:  # type: ignore[type-arg]
    """The pipeline run once it has ended, which must be a success."""
    wait_for(
        lambda: server.request("GET", f"pipelines/runs/{run_id}")["state"] != "running",
        timeout=300,
        interval=0.2,
        message="the pipeline run to end",
    )
    run = server.request("GET", f"pipelines/runs/{run_id}")
    assert run["state"] == "succeeded", run
    return run


def test_an_elyra_pipeline_runs_each_node_as_a_job(elyra_server: Server) -> None:
    root = elyra_server.root
    wait_for(lambda: "rc-local" in runtimes(elyra_server), timeout=60, interval=0.2, message="rc-local")
    first, second = str(uuid.uuid4()), str(uuid.uuid4())

    # The first node waits for a file only this test writes: /schedule must answer while it runs.
    answer = elyra_server.request_at("POST", "/elyra/pipeline/schedule", two_node_pipeline(first, second))
    assert answer["run_url"].startswith("/remote-compute/pipelines/runs/"), answer
    run_id = answer["run_url"].rsplit("/", 1)[1]
    run = elyra_server.request("GET", f"pipelines/runs/{run_id}")
    assert run["state"] == "running" and run["nodes"][second]["state"] == "waiting", run

    document = json.loads((root / "flow.elyra.rcpipeline").read_text())
    assert document["edges"] == [{"from": first, "to": second}]
    assert document["nodes"][1]["settings"]["command"] == "python3 second.py"
    assert document["nodes"][1]["settings"]["env"] == {"SUFFIX": "!"}

    (root.parent / "release").write_text("")
    run = succeeded_run(elyra_server, run_id)
    for node_id in (first, second):
        job = elyra_server.request("GET", f"jobs/{run['nodes'][node_id]['job_id']}")
        assert job["state"] == "succeeded" and job["machine"] == "local", job
    # The second node got the first's output (and its own env var), and its output came back.
    assert (root / "result.txt").read_text() == "42!"


def notebook(*sources: str) -> str:
    cells = [
        {"cell_type": "code", "metadata": {}, "source": s, "outputs": [], "execution_count": None} for s in sources
    ]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def test_an_elyra_notebook_node_runs_as_a_notebook_job_and_its_executed_copy_comes_back(elyra_server: Server) -> None:
    root = elyra_server.root
    (root / "second.ipynb").write_text(
        notebook(
            "import os, pathlib\ndata = pathlib.Path('data.txt').read_text()",
            "pathlib.Path('result.txt').write_text(data + os.environ['SUFFIX'])\nprint('wrote', data)",
        )
    )
    (root.parent / "release").write_text("")  # the first node need not wait here
    wait_for(lambda: "rc-local" in runtimes(elyra_server), timeout=60, interval=0.2, message="rc-local")
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    answer = elyra_server.request_at(
        "POST", "/elyra/pipeline/schedule", two_node_pipeline(first, second, "second.ipynb")
    )
    run_id = answer["run_url"].rsplit("/", 1)[1]
    document = json.loads((root / "flow.elyra.rcpipeline").read_text())
    assert document["nodes"][1]["step"] == "run-notebook-on-remote-machine"
    run = succeeded_run(elyra_server, run_id)
    job = elyra_server.request("GET", f"jobs/{run['nodes'][second]['job_id']}")
    assert job["state"] == "succeeded" and job["machine"] == "local", job
    assert (root / "result.txt").read_text() == "42!"
    # The executed notebook came back beside it, its cells run in order, the print in its outputs.
    executed = json.loads((root / "second.executed.ipynb").read_text())
    cells = executed["cells"]
    assert [c["execution_count"] for c in cells if c["cell_type"] == "code"] == [1, 2]
    printed = "".join("".join(o.get("text", "")) for o in cells[-1]["outputs"])  # a str or nbformat's lines
    assert "wrote 42" in printed, cells[-1]


class Operation:
    """What Elyra's parser hands ``process`` for a generic node (its ``GenericOperation``'s attributes)."""

    is_generic = True
    classifier = "execute-python-node"

    def __init__(self, name: str, filename: str, parents: list[str], **props: Any) -> None:
        self.name, self.filename, self.parent_operation_ids = name, filename, parents
        self.dependencies, self.outputs = props.get("dependencies", []), props.get("outputs", [])
        self.env_vars = props.get("env_vars", [])


class EnvVar:
    def __init__(self, env_var: str, value: str) -> None:
        self.env_var, self.value = env_var, value


class ElyraPipeline:
    def __init__(self, **operations: Operation) -> None:
        self.operations = operations


def test_nodes_keep_elyra_s_paths_relative_to_their_file(tmp_path: Path) -> None:
    from jupyter_remote_compute.elyra.convert import to_document
    from jupyter_remote_compute.pipelines.document import Pipeline

    pipeline = ElyraPipeline(
        a=Operation("prep", "work/prep/clean.ipynb", [], dependencies=["raw.csv"], outputs=["clean.csv"]),
        b=Operation("fit", "work/fit/fit.py", ["a"], outputs=["out/model.pkl"], env_vars=[EnvVar("SEED", "7")]),
    )
    # Elyra's root is the server's; the workspace may be a folder below it.
    document = to_document(pipeline, "gpu-box", tmp_path, tmp_path / "work")
    a, b = document["nodes"]
    assert a["step"] == "run-notebook-on-remote-machine"
    assert a["settings"] == {
        "machine": "gpu-box", "name": "prep", "notebook": "prep/clean.ipynb",
        "send": ["prep/raw.csv"], "bring_back": ["prep/clean.csv"],
    }  # fmt: skip
    assert b["step"] == "train-on-remote-machine"
    assert b["settings"]["command"] == "cd fit && python3 fit.py"
    assert b["settings"]["send"] == ["fit/fit.py"] and b["settings"]["bring_back"] == ["fit/out/model.pkl"]
    assert b["settings"]["env"] == {"SEED": "7"}
    assert document["edges"] == [{"from": "a", "to": "b"}]
    Pipeline.from_json(document)  # the product's own reading of it


def test_a_node_the_product_cannot_run_is_named(tmp_path: Path) -> None:
    from jupyter_remote_compute.elyra.convert import to_document
    from jupyter_remote_compute.errors import InvalidSettings

    with pytest.raises(InvalidSettings, match=re.escape("node 'query'.filename: q.sql is neither a notebook nor")):
        to_document(ElyraPipeline(a=Operation("query", "q.sql", [])), "local", tmp_path, tmp_path)
    with pytest.raises(InvalidSettings, match=re.escape("node 'up'.dependencies: ../secret.txt is not inside")):
        to_document(ElyraPipeline(a=Operation("up", "up.py", [], dependencies=["../secret.txt"])), "local",
                    tmp_path / "ws", tmp_path / "ws")  # fmt: skip
