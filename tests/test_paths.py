"""A corpus of hostile paths, names and addresses: each refused with a clear error naming the setting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jupyter_remote_compute import engines
from jupyter_remote_compute.errors import InvalidSettings
from jupyter_remote_compute.jobs.spec import JobSpec

BAD_PATHS = [
    "../outside.txt",
    "data/../../outside.txt",
    "/etc/passwd",
    "~/secrets.txt",
    "C:\\data\\x.csv",
    "data\\..\\x",
    "line\nbreak.txt",
    "tab\there",
    "nul\0byte",
    ".",
    ".punica/jobs.json",
    "./.punica/compute.yaml",
    "",
]


@pytest.mark.parametrize("path", BAD_PATHS)
@pytest.mark.parametrize("setting", ["send", "bring_back"])
def test_hostile_paths_are_refused_naming_the_setting(setting: str, path: str) -> None:
    with pytest.raises(InvalidSettings) as info:
        JobSpec.from_json({"command": "true", setting: [path]})
    assert info.value.field == f"{setting}[0]"
    assert "\n" not in info.value.message.replace("\\n", "")


def test_a_pipe_or_device_in_the_workspace_is_refused(workspace: Path, make_service) -> None:
    os.mkfifo(workspace / "pipe")
    service = make_service(workspace)
    with pytest.raises(InvalidSettings) as info:
        service.submit(JobSpec.from_json({"command": "true", "send": ["pipe"]}))
    assert "not a regular file" in info.value.message and info.value.field == "send[0]"


def test_a_glob_through_a_link_out_of_the_workspace_is_refused(workspace: Path, tmp_path: Path, make_service) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.csv").write_text("x")
    (workspace / "data").symlink_to(outside)
    service = make_service(workspace)
    with pytest.raises(InvalidSettings) as info:
        service.submit(JobSpec.from_json({"command": "true", "send": ["data/*.csv"]}))
    assert "leads out of the workspace" in info.value.message


def test_hostile_file_names_inside_the_workspace_still_work(workspace: Path, make_service) -> None:
    names = ["with space.txt", "quote'\"s.txt", "$(touch pwned).txt", "-leading-dash.txt", "ünï.txt", "semi;colon.txt"]
    for name in names:
        (workspace / name).write_text(name)
    service = make_service(workspace)
    spec = JobSpec.from_json({"command": ["sh", "-c", 'cat -- "$@" > all.txt', "sh", *names], "send": names,
                              "bring_back": ["all.txt"]})  # fmt: skip
    job = service.wait(service.submit(spec).job.id, timeout=60)
    assert job.state == "succeeded", job.reason
    assert (workspace / "all.txt").read_text() == "".join(names)
    assert not (workspace / "pwned).txt").exists() and not list(workspace.glob("pwned*"))


@pytest.mark.parametrize(
    "address",
    ["gpu-box\nProxyCommand evil", "gpu box", "-oProxyCommand=evil", "host;rm -rf /", "", " host"],
)
def test_hostile_ssh_addresses_are_refused(address: str) -> None:
    with pytest.raises(ValueError):
        engines.engine_class("ssh").validate_address(address)


@pytest.mark.parametrize(
    "address",
    ["https://user:pass@hub.example.org/", "ftp://hub.example.org/", "https://hub.example.org/?token=abc", "hub\n"],
)
def test_hostile_jupyter_addresses_are_refused_without_echoing_them(address: str) -> None:
    with pytest.raises(ValueError) as info:
        engines.engine_class("jupyter").validate_address(address)
    assert "pass@" not in str(info.value) and "token=abc" not in str(info.value)


@pytest.mark.parametrize("name", ["Box", "a b", "a;b", "../x", "a\nb", "-x", "x" * 41, "local"])
def test_hostile_machine_names_are_refused(workspace: Path, make_service, name: str) -> None:
    service = make_service(workspace)
    with pytest.raises(InvalidSettings) as info:
        service.machines.add(name, "ssh", "gpu-box.lab")
    assert info.value.field == "name"
    assert not (workspace / ".punica/compute.yaml").exists()
