"""What each kind can do is declared on its engine and served as it is declared."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_remote_compute.engines import BUILT_IN_KINDS, engine_class, engine_kinds
from jupyter_remote_compute.engines.base import RESOURCE_NAMES, Features
from jupyter_remote_compute.errors import InvalidSettings


async def test_the_kinds_route_serves_each_kinds_declared_features(jp_fetch) -> None:
    response = await jp_fetch("remote-compute", "kinds")
    kinds = {k["kind"]: k for k in json.loads(response.body)["kinds"]}
    assert set(kinds) == set(engine_kinds())
    for name, kind in kinds.items():
        assert kind["features"] == engine_class(name).features.to_json(), name
        assert kind["remote"] is engine_class(name).features.remote
    assert kinds["local"]["features"]["remote"] is False
    assert kinds["ssh"]["features"]["host_keys"] is True and kinds["jupyter"]["features"]["host_keys"] is False
    assert kinds["slurm"]["features"]["resources"] == list(RESOURCE_NAMES)
    assert kinds["agent"]["features"] == {**kinds["agent"]["features"], "pending": True, "live_metrics": False}
    # The machines list carries the same kinds: one function makes both.
    machines = json.loads((await jp_fetch("remote-compute", "machines")).body)
    assert {k["kind"]: k for k in machines["kinds"]} == kinds


async def test_trusting_a_kind_without_host_keys_is_the_callers_mistake(jp_fetch) -> None:
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("remote-compute", "machines", "local", "trust", method="POST", body="{}")
    assert info.value.code == 400
    assert "has no host key to trust" in json.loads(info.value.response.body)["message"]


def test_a_machine_refuses_the_resources_its_kind_does_not_declare(tmp_path) -> None:
    from jupyter_remote_compute.engines.base import EngineContext
    from jupyter_remote_compute.engines.resources import Resources

    cls = engine_class("local")
    assert "partition" not in cls.features.resources
    engine = cls("local", "localhost", {}, EngineContext(lambda name: None, tmp_path))
    with pytest.raises(InvalidSettings) as info:
        engine.admit(Resources(partition="gpu"))
    assert info.value.field == "resources.partition"

    class Partitioned(cls):  # the same machine, declaring partitions: the base check lets them through
        features = Features(remote=False, resources=frozenset(RESOURCE_NAMES))

    Partitioned("local", "localhost", {}, EngineContext(lambda name: None, tmp_path)).admit(Resources(partition="gpu"))


def test_features_serialise_resources_in_a_stable_order() -> None:
    features = Features(resources=frozenset({"partition", "cpus"}), unavailable="install it")
    assert features.to_json()["resources"] == ["cpus", "partition"]
    assert features.to_json()["unavailable"] == "install it"
    assert "unavailable" not in Features().to_json()


def test_the_organizations_kind_loads_but_is_no_kind_a_machine_is_added_as(tmp_path, monkeypatch) -> None:
    """``organization`` is a job's machine reached through the hub's service: never listed, never added;
    and ``org:NAME`` outside a hub says where such a machine is reached."""
    from jupyter_remote_compute.errors import NotFound
    from jupyter_remote_compute.jobs.service import JobService
    from jupyter_remote_compute.workspace import Workspace

    assert engine_class("organization").kind == "organization" and "organization" not in engine_kinds()
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    service = JobService(Workspace(tmp_path))
    with pytest.raises(InvalidSettings) as refused:
        service.admin.add("team", "organization", "somewhere")
    assert refused.value.field == "kind" and "organization" not in refused.value.message
    with pytest.raises(NotFound, match="organization service"):
        service.admin.resolve("org:team")
    with pytest.raises(NotFound):
        service.admin.resolve("team")


@pytest.mark.parametrize(
    ("asked", "field"),
    [
        ({"nodes": 2}, "resources.nodes"),
        ({"processes_per_node": 2}, "resources.processes_per_node"),
        ({"launcher": "plain"}, "resources.launcher"),
    ],
)
def test_only_slurm_and_an_ssh_host_list_start_a_job_of_several_processes(asked: dict, field: str) -> None:
    from jupyter_remote_compute.engines.base import refuse_distributed
    from jupyter_remote_compute.engines.resources import Resources

    resources = Resources.from_json(asked)
    host_list = engine_class("ssh").features_for({"hosts": ["gpu1", "gpu2"]})
    assert host_list.launchers == ("plain", "torchrun") and "nodes" in host_list.resources
    refuse_distributed(resources, host_list, "pair", "ssh")
    for kind in BUILT_IN_KINDS:
        features = engine_class(kind).features
        if kind == "slurm":
            assert features.launchers == ("plain", "torchrun")
            refuse_distributed(resources, features, "hpc", kind)
            continue
        assert features.launchers == (), kind
        with pytest.raises(InvalidSettings) as info:
            refuse_distributed(resources, features, "m1", kind)
        assert info.value.field == field and str(info.value).startswith(f"{field}: m1 is a {kind} machine"), info.value
