"""Resources per job: part of the spec and its key, checked with errors naming the field, refused at submit
by a machine that cannot give them."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from jupyter_remote_compute.errors import InvalidSettings
from jupyter_remote_compute.jobs.key import job_key
from jupyter_remote_compute.jobs.service import JobService
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.run_options import add_run_options, command_of, spec_settings
from jupyter_remote_compute.steps.executor import parse_settings

STEP_SCHEMA = Path(__file__).parents[1] / "jupyter_remote_compute" / "steps" / "train_on_remote_machine.json"


def test_resources_round_trip_through_the_stored_spec() -> None:
    spec = JobSpec.from_json({"command": "true", "resources": {"gpus": 2, "cpus": "8", "memory": "1536M", "nodes": 1}})
    assert spec.resources.cpus == 8 and spec.resources.memory_mb == 1536
    stored = json.loads(json.dumps(spec.to_json()))
    assert stored["resources"] == {"gpus": 2, "cpus": 8, "nodes": 1, "memory": "1536M"}
    assert JobSpec.from_stored(stored) == spec


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        ({"gpus": -1}, "resources.gpus"),
        ({"cpus": "many"}, "resources.cpus"),
        ({"memory": "lots"}, "resources.memory"),
        ({"nodes": 0}, "resources.nodes"),
        ({"partition": "a b"}, "resources.partition"),
        ({"disks": 2}, "resources.disks"),
    ],
)
def test_a_bad_resource_is_refused_naming_its_field(resources: dict, field: str) -> None:
    with pytest.raises(InvalidSettings) as e:
        JobSpec.from_json({"command": "true", "resources": resources})
    assert e.value.field == field and str(e.value).startswith(field + ":")


def test_resources_are_part_of_the_key_and_asking_for_none_keeps_old_keys() -> None:
    plain = JobSpec.from_json({"command": "python train.py"})
    empty = JobSpec.from_json({"command": "python train.py", "resources": {}})
    two = JobSpec.from_json({"command": "python train.py", "resources": {"gpus": 2}})
    four = JobSpec.from_json({"command": "python train.py", "resources": {"gpus": 4}})
    assert job_key(plain, []) == job_key(empty, [])
    assert len({job_key(plain, []), job_key(two, []), job_key(four, [])}) == 3


def test_run_options_carry_resources_to_the_spec() -> None:
    parser = argparse.ArgumentParser()
    add_run_options(parser)
    args = parser.parse_args(["--gpus", "2", "--memory", "32G", "--partition", "gpu", "--", "python", "t.py"])
    spec = JobSpec.from_json(spec_settings(args, command_of(args)))
    assert spec.resources.to_json() == {"gpus": 2, "partition": "gpu", "memory": "32G"}
    args = parser.parse_args(
        ["--nodes", "2", "--procs-per-node", "4", "--launcher", "torchrun", "--", "python", "t.py"]
    )
    spec = JobSpec.from_json(spec_settings(args, command_of(args)))
    assert spec.resources.to_json() == {"nodes": 2, "processes_per_node": 4, "launcher": "torchrun"}
    args = parser.parse_args(["--launcher", "mpirun", "--", "true"])
    with pytest.raises(
        InvalidSettings, match=r"^resources\.launcher: 'mpirun' is not a launcher: use torchrun or plain"
    ):
        JobSpec.from_json(spec_settings(args, command_of(args)))
    args = parser.parse_args(["--cpus", "zero", "--", "true"])
    with pytest.raises(InvalidSettings, match=r"^resources\.cpus:"):
        JobSpec.from_json(spec_settings(args, command_of(args)))


def test_the_step_takes_resources_and_its_schema_declares_them() -> None:
    spec, _ = parse_settings({"command": "true", "resources": {"cpus": 2, "memory": "512M"}})
    assert spec.resources.cpus == 2 and spec.resources.memory_mb == 512
    schema = json.loads(STEP_SCHEMA.read_text())["settings"]["properties"]["resources"]
    assert set(schema["properties"]) == {
        "gpus",
        "cpus",
        "memory",
        "nodes",
        "partition",
        "processes_per_node",
        "launcher",
    }


def test_local_refuses_more_than_this_machine_has(make_service: Callable[..., JobService], quickstart: Path) -> None:
    service = make_service(quickstart)
    for resources, field in (
        ({"gpus": 1000}, "resources.gpus"),
        ({"cpus": 100000}, "resources.cpus"),
        ({"nodes": 2}, "resources.nodes"),
        ({"partition": "gpu"}, "resources.partition"),
        ({"processes_per_node": 2}, "resources.processes_per_node"),
        ({"launcher": "torchrun"}, "resources.launcher"),
    ):
        with pytest.raises(InvalidSettings) as e:
            service.submit(JobSpec.from_json({"command": "true", "resources": resources}))
        assert e.value.field == field, e.value
    with pytest.raises(
        InvalidSettings, match=r"^resources\.processes_per_node: local is a local machine, which starts"
    ):
        service.submit(JobSpec.from_json({"command": "true", "resources": {"processes_per_node": 4}}))
    with pytest.raises(
        InvalidSettings, match=r"^resources\.launcher: local is a local machine, which cannot start plain"
    ):
        service.submit(JobSpec.from_json({"command": "true", "resources": {"launcher": "plain"}}))
    with pytest.raises(InvalidSettings, match=r"^resources\.gpus: 1000 asked, but local has \d+ GPUs"):
        service.submit(JobSpec.from_json({"command": "true", "resources": {"gpus": 1000}}))
    assert service.list_jobs() == []  # nothing was stored for a refused job
    job = service.wait(service.submit(JobSpec.from_json({"command": "true", "resources": {"cpus": 1}})).job.id, 60)
    assert job.state == "succeeded", job.reason
    assert job.spec.resources.cpus == 1
