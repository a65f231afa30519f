"""The machine registry over .punica/compute.yaml: validation, round-trip fidelity, stale writes, locking."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import filelock
import pytest

import jupyter_remote_compute.engines
from jupyter_remote_compute.engines.base import Engine, OptionField
from jupyter_remote_compute.errors import ConfigFileError, Conflict, InvalidSettings, NotFound
from jupyter_remote_compute.machines import registry as machines_module
from jupyter_remote_compute.machines.registry import HEADER, LOCAL_MACHINE, MachineRegistry
from jupyter_remote_compute.workspace import Workspace

CREATED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


class FakeEngine(Engine):
    """A test-only kind with one option of each type the registry must check."""

    kind = "fake"
    label = "Fake"
    options = {
        "user": OptionField(str, "login name"),
        "port": OptionField(int, "port"),
        "verbose": OptionField(bool, "chatty"),
        "token_secret": OptionField(str, "Secret Manager entry", secret_name=True),
    }

    @classmethod
    def validate_address(cls, address: str) -> str:
        address = super().validate_address(address)
        if "://" in address:
            raise ValueError("a fake address is a host name, not a URL")
        return address.lower()  # normalised: the registry must store what this returns

    def check(self) -> dict[str, Any]:
        raise NotImplementedError

    def prepare(self, job: Any) -> Any:
        raise NotImplementedError

    def send(self, job: Any, files: Any, progress: Any = None) -> Any:
        raise NotImplementedError

    def start(self, job: Any, launch: Any) -> Any:
        raise NotImplementedError

    def poll(self, jobs: Any) -> Any:
        raise NotImplementedError

    def read_log(self, job: Any, offset: int, limit: int) -> bytes:
        raise NotImplementedError

    def cancel(self, job: Any, grace: float) -> None:
        raise NotImplementedError

    def fetch(self, job: Any, outputs: Any, dest: Path, progress: Any = None) -> Any:
        raise NotImplementedError

    def cleanup(self, job: Any) -> None:
        raise NotImplementedError


class StrictEngine(FakeEngine):
    kind = "strict"
    options = {"base_dir": OptionField(str, "where jobs live", required=True)}


@pytest.fixture(autouse=True)
def fake_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = jupyter_remote_compute.engines._registry()
    monkeypatch.setitem(registry, "fake", FakeEngine)
    monkeypatch.setitem(registry, "strict", StrictEngine)


@pytest.fixture
def path(workspace: Path) -> Path:
    return Workspace(workspace).compute_yaml


@pytest.fixture
def registry(path: Path) -> MachineRegistry:
    return MachineRegistry(path)


# A hand-written file with everything a person might put there.
HAND_WRITTEN = """\
# Machines this workspace may train on
# (edited by hand, keep the comments)
version: 1   # unknown top-level key, before machines

machines:   # the machines
  # the first one
  gpu-box:    # the big one
    kind: fake
    address: gpu-box.lab      # a host or a ~/.ssh/config alias
    user: 'ana'
    port: 0x16
    notes: "bought in 2025; a deliberately long line that must not be folded by the writer at eighty columns"
    labels: [gpu, fast]
    enabled: true
    created: 2026-11-29T10:02:00Z
  # about mid-box, right under gpu-box
  mid-box:
    kind: fake
    address: mid.lab
    enabled: false    # switched off for now
    created: 2026-11-29T10:03:00Z

  # between entries, after a blank line
  team-lab:
    kind: fake
    address: team.lab
    token_secret: compute/team-lab
    future-key:
      nested: yes
    enabled: true
    created: 2026-11-29T10:05:00Z
  # trailing comment after the last machine

defaults:   # unknown top-level key, after machines
  timeout: 3600
# end of file
"""


def cut(text: str, name: str) -> str:
    """``text`` without the lines of machine ``name`` (its key line and every deeper line after it)."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    inside = False
    for line in lines:
        if line.startswith(f"  {name}:"):
            inside = True
            continue
        if inside and line.startswith("   ") and line.strip():
            continue
        inside = False
        out.append(line)
    return "".join(out)


def write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


# -- reading -----------------------------------------------------------------------------------
def test_missing_file_lists_only_the_builtin_machine(registry: MachineRegistry, path: Path) -> None:
    assert registry.version() == "absent"
    assert registry.list() == [LOCAL_MACHINE]
    local = registry.get("local")
    assert local.builtin and local.kind == "local" and local.enabled and local.created is None
    assert not path.exists()  # reading never creates the file


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing here yet\n", "machines:\n", "machines: {}\n", "other: 1\n"])
def test_empty_or_machineless_file_means_no_machines(registry: MachineRegistry, path: Path, text: str) -> None:
    write(path, text)
    assert registry.list() == [LOCAL_MACHINE]


def test_list_reads_the_hand_written_file_in_order(registry: MachineRegistry, path: Path) -> None:
    write(path, HAND_WRITTEN)
    listed = registry.list()
    assert [m.name for m in listed] == ["local", "gpu-box", "mid-box", "team-lab"]
    gpu = registry.get("gpu-box")
    assert gpu.kind == "fake" and gpu.address == "gpu-box.lab" and gpu.enabled is True
    # created stays the plain string it is in the file, not a datetime
    assert gpu.created == "2026-11-29T10:02:00Z" and type(gpu.created) is str
    # options are plain Python values (0x16 is an int, not a ruamel subclass), unknown keys included
    assert gpu.options["port"] == 22 and type(gpu.options["port"]) is int
    assert gpu.options["labels"] == ["gpu", "fast"] and type(gpu.options["labels"]) is list
    assert registry.get("mid-box").enabled is False
    assert registry.get("team-lab").options["future-key"] == {"nested": "yes"}
    json.dumps([m.to_json() for m in listed])  # JSON-able as the server sends it


def test_to_json(registry: MachineRegistry) -> None:
    machine = registry.add("gpu-box", "fake", "gpu-box.lab", {"port": 22})
    assert machine.to_json() == {
        "name": "gpu-box",
        "kind": "fake",
        "address": "gpu-box.lab",
        "enabled": True,
        "created": machine.created,
        "options": {"port": 22},
        "builtin": False,
    }
    assert LOCAL_MACHINE.to_json()["builtin"] is True


def test_get_unknown_names_the_machine_and_the_file(registry: MachineRegistry, path: Path) -> None:
    write(path, HAND_WRITTEN)
    with pytest.raises(NotFound) as caught:
        registry.get("nope")
    assert "'nope'" in caught.value.message and str(path) in caught.value.message


def test_version_is_a_digest_of_the_bytes_on_disk(registry: MachineRegistry, path: Path) -> None:
    write(path, HAND_WRITTEN)
    first = registry.version()
    assert first == registry.version() and first != "absent"
    write(path, HAND_WRITTEN + "# one more comment\n")
    assert registry.version() != first
    version, listed = registry.snapshot()
    assert version == registry.version() and listed == registry.list()


# -- adding ------------------------------------------------------------------------------------
def test_first_add_creates_the_file_with_a_header(registry: MachineRegistry, path: Path) -> None:
    machine = registry.add("gpu-box", "fake", "GPU-Box.lab", {"user": "ana", "port": 22})
    text = path.read_text()
    assert text.startswith(HEADER + "machines:\n  gpu-box:\n    kind: fake\n    address: gpu-box.lab\n")
    # created is written unquoted, the way a person writes a timestamp
    assert re.search(r"^    created: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", text, re.MULTILINE)
    assert CREATED.match(machine.created or "")
    assert machine.address == "gpu-box.lab"  # what validate_address returned
    assert registry.get("gpu-box") == machine
    assert [m.name for m in registry.list()] == ["local", "gpu-box"]
    assert "local" not in text


def test_add_to_an_empty_file(registry: MachineRegistry, path: Path) -> None:
    write(path, "")
    registry.add("a", "fake", "a.lab")
    assert path.read_text().startswith(HEADER + "machines:\n  a:\n")


def test_add_keeps_a_comment_only_file_and_a_file_without_machines(registry: MachineRegistry, path: Path) -> None:
    write(path, "# our own words\n")
    registry.add("a", "fake", "a.lab")
    assert path.read_text().startswith("# our own words\nmachines:\n  a:\n")
    write(path, "other: 1   # keep me\n")
    registry.add("b", "fake", "b.lab")
    assert path.read_text().startswith("other: 1   # keep me\nmachines:\n  b:\n")
    assert [m.name for m in registry.list()] == ["local", "b"]


def test_add_to_hand_written_file_changes_nothing_else(registry: MachineRegistry, path: Path) -> None:
    write(path, HAND_WRITTEN)
    registry.add("new-box", "fake", "new.lab", {"port": 2222, "token_secret": "compute/new"})
    after = path.read_text()
    assert cut(after, "new-box") == HAND_WRITTEN
    # appended after the last machine, before the lines that followed it
    assert after.index("  new-box:") > after.index("  team-lab:")
    assert after.index("  new-box:") < after.index("  # trailing comment after the last machine")
    assert [m.name for m in registry.list()][-1] == "new-box"
    # the new entry is laid out as the design's example
    entry = after[after.index("  new-box:") :].splitlines()[:7]
    assert [line.split(":")[0].strip() for line in entry] == [
        "new-box",
        "kind",
        "address",
        "port",
        "token_secret",
        "enabled",
        "created",
    ]


def test_add_refuses_a_duplicate_name(registry: MachineRegistry, path: Path) -> None:
    write(path, HAND_WRITTEN)
    with pytest.raises(Conflict) as caught:
        registry.add("gpu-box", "fake", "other.lab")
    assert caught.value.field == "name"
    assert path.read_text() == HAND_WRITTEN


@pytest.mark.parametrize("name", ["", "GPU", "gpu_box", "-gpu", "gpu box", "a" * 41, "gpü", "a.b", 7])
def test_add_refuses_a_bad_name(registry: MachineRegistry, path: Path, name: Any) -> None:
    with pytest.raises(InvalidSettings) as caught:
        registry.add(name, "fake", "a.lab")
    assert caught.value.field == "name"
    assert "lowercase letters, digits and '-'" in caught.value.message
    assert not path.exists()


def test_longest_name_is_accepted(registry: MachineRegistry) -> None:
    assert registry.add("a" * 40, "fake", "a.lab").name == "a" * 40


def test_local_is_reserved(registry: MachineRegistry, path: Path) -> None:
    with pytest.raises(InvalidSettings) as caught:
        registry.add("local", "fake", "a.lab")
    assert caught.value.field == "name" and "built-in" in caught.value.message
    with pytest.raises(InvalidSettings) as caught:
        registry.add("mine", "local", "a.lab")
    assert caught.value.field == "kind" and "built-in" in caught.value.message
    for attempt in (
        lambda: registry.update("local", address="x"),
        lambda: registry.set_enabled("local", False),
        lambda: registry.remove("local"),
    ):
        with pytest.raises(Conflict, match="built-in"):
            attempt()
    assert not path.exists()


def test_unknown_kind_lists_the_known_ones(registry: MachineRegistry) -> None:
    with pytest.raises(InvalidSettings) as caught:
        registry.add("a", "mainframe", "a.lab")
    assert caught.value.field == "kind"
    assert "'mainframe'" in caught.value.message and "fake" in caught.value.message and "strict" in caught.value.message


def test_address_is_checked_by_the_engine(registry: MachineRegistry) -> None:
    with pytest.raises(InvalidSettings) as caught:
        registry.add("a", "fake", "https://a.lab/")
    assert caught.value.field == "address" and "not a URL" in caught.value.message
    with pytest.raises(InvalidSettings) as caught:
        registry.add("a", "fake", "a.lab\nmalicious: 1")
    assert caught.value.field == "address"


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"nope": 1}, "options.nope", "unknown option"),
        ({"port": "22"}, "options.port", "whole number"),
        ({"port": True}, "options.port", "whole number"),  # a bool is not an int
        ({"port": 2.5}, "options.port", "whole number"),
        ({"verbose": 1}, "options.verbose", "true or false"),
        ({"user": 5}, "options.user", "text"),
        ({"kind": "fake"}, "options.kind", "machine field"),
        ({"created": "2020-01-01T00:00:00Z"}, "options.created", "machine field"),
    ],
)
def test_options_are_checked_against_the_kind(
    registry: MachineRegistry, options: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(InvalidSettings) as caught:
        registry.add("a", "fake", "a.lab", options)
    assert caught.value.field == field
    assert words in caught.value.message


@pytest.mark.parametrize(
    ("hosts", "words"),
    [
        (["gpu1"], "expected a list of two or more ssh hosts"),
        (["gpu2", "gpu1"], "options.hosts[0]: the first host is the rendezvous and must be the machine's address"),
        (["gpu1", "gpu1"], "options.hosts[1]: gpu1 is listed twice"),
        (["gpu1", "-oProxyCommand=x"], "options.hosts[1]: use a host name"),
        (["gpu1", 2], "options.hosts[1]: expected an ssh host (text)"),
        ("gpu1,gpu2", "options.hosts must be list"),
    ],
)
def test_an_ssh_host_list_names_its_hosts_the_first_the_address(
    registry: MachineRegistry, path: Path, hosts: Any, words: str
) -> None:
    with pytest.raises(InvalidSettings) as caught:
        registry.add("pair", "ssh", "gpu1", {"hosts": hosts})
    assert caught.value.field == "options.hosts" and words in caught.value.message, caught.value.message
    added = registry.add("pair", "ssh", "gpu1", {"hosts": ["gpu1", "gpu2"]})
    assert added.options["hosts"] == ["gpu1", "gpu2"]
    with pytest.raises(InvalidSettings) as caught:
        registry.update("pair", address="gpu2")
    assert caught.value.field == "options.hosts", caught.value.message
    with pytest.raises(InvalidSettings) as caught:
        registry.add("hpc", "slurm", "login", {"hosts": ["login", "other"]})
    assert caught.value.field == "options.hosts" and "unknown option" in caught.value.message


def test_a_hand_written_host_list_that_the_form_would_refuse_is_refused_at_first_use_naming_machine_and_file(
    workspace: Path, path: Path
) -> None:
    """The form checks ``hosts`` at save; a compute.yaml written by hand is read as it is, so a submit is
    what finds the list that starts elsewhere than the machine's address: a clear error, nothing queued."""
    write(path, "machines:\n  pair:\n    kind: ssh\n    address: gpu1\n    hosts: [gpu2, gpu1]\n")
    cli = [sys.executable, "-m", "jupyter_remote_compute.cli", "--workspace", str(workspace)]
    ran = subprocess.run(
        [*cli, "run", "--machine", "pair", "--nodes", "2", "--", "hostname"], capture_output=True, text=True
    )
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr
    assert ran.stderr.startswith(
        f"error: machine 'pair' in {path}: options.hosts[0]: the first host is the rendezvous"
    ), ran.stderr
    assert "list gpu1 first; correct it there" in ran.stderr
    listed = subprocess.run([*cli, "jobs", "list", "--json"], capture_output=True, text=True)
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stdout + listed.stderr
    # Listed as written: no date of creation (none was written), not "built-in" as local is.
    rows = subprocess.run([*cli, "machines", "list"], capture_output=True, text=True).stdout.splitlines()
    column = rows[0].index("CREATED")
    assert [row[column:].split()[0] for row in rows[1:]] == ["built-in", "-"], rows


def test_required_option(registry: MachineRegistry) -> None:
    with pytest.raises(InvalidSettings) as caught:
        registry.add("a", "strict", "a.lab")
    assert caught.value.field == "options.base_dir" and "required" in caught.value.message
    assert registry.add("a", "strict", "a.lab", {"base_dir": "/scratch"}).options == {"base_dir": "/scratch"}
    with pytest.raises(InvalidSettings) as caught:
        registry.update("a", options={"base_dir": None})
    assert caught.value.field == "options.base_dir"


@pytest.mark.parametrize("key", ["token", "password", "secret", "Token", "api_key", "ssh_password"])
def test_a_secret_is_never_accepted_as_an_option(registry: MachineRegistry, path: Path, key: str) -> None:
    value = "s3cr3t-value-123"
    with pytest.raises(InvalidSettings) as caught:
        registry.add("a", "fake", "a.lab", {key: value})
    assert caught.value.field == f"options.{key}"
    assert "Secret Manager" in caught.value.message and "token_secret" in caught.value.message
    assert value not in caught.value.message
    registry.add("a", "fake", "a.lab")
    with pytest.raises(InvalidSettings):
        registry.update("a", options={key: value})
    assert value not in path.read_text()


@pytest.mark.parametrize(
    "value",
    [
        "secret:compute/x",  # a reference, not a name
        "has space",
        "",
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",  # a pasted hex token
        "ghpAbC123xYz456QrS789tUv012WxY",  # a pasted opaque token
    ],
)
def test_a_secret_name_option_takes_a_plain_name(registry: MachineRegistry, path: Path, value: str) -> None:
    with pytest.raises(InvalidSettings) as caught:
        registry.add("a", "fake", "a.lab", {"token_secret": value})
    assert caught.value.field == "options.token_secret"
    if value:
        assert value not in caught.value.message  # it may be the secret itself
    assert not path.exists()


@pytest.mark.parametrize("value", ["compute/team-lab", "A1", "myverylongsecretname2024abc"])
def test_a_secret_name_option_accepts_a_name(registry: MachineRegistry, value: str) -> None:
    machine = registry.add("a", "fake", "a.lab", {"token_secret": value})
    assert machine.options["token_secret"] == value


def test_enabled_must_be_a_bool(registry: MachineRegistry) -> None:
    with pytest.raises(InvalidSettings) as caught:
        registry.add("a", "fake", "a.lab", enabled="yes")  # type: ignore[arg-type]
    assert caught.value.field == "enabled"
    assert registry.add("a", "fake", "a.lab", enabled=False).enabled is False


# -- updating ----------------------------------------------------------------------------------
def test_update_merges_options_and_keeps_the_rest(registry: MachineRegistry, path: Path) -> None:
    write(path, HAND_WRITTEN)
    before = registry.get("gpu-box")
    after = registry.update("gpu-box", address="GPU2.lab", options={"user": "bo", "port": None, "verbose": True})
    assert after.address == "gpu2.lab"
    assert "port" not in after.options
    assert after.options["user"] == "bo" and after.options["verbose"] is True
    # keys this code does not know stay, and so does created
    assert after.options["notes"] == before.options["notes"] and after.options["labels"] == ["gpu", "fast"]
    assert after.created == before.created and after.enabled is True
    assert registry.get("gpu-box") == after
    text = path.read_text()
    assert cut(text, "gpu-box") == cut(HAND_WRITTEN, "gpu-box")
    # the changed entry keeps its comments and the untouched lines keep their spelling
    assert re.search(r"\n    address: gpu2\.lab +# a host or a ~/\.ssh/config alias\n", text)
    assert "  gpu-box:    # the big one\n" in text
    assert "    labels: [gpu, fast]\n" in text
    # a new option goes before enabled/created, as in a new entry
    assert text.index("    verbose: true") < text.index("    enabled: true\n    created: 2026-11-29T10:02:00Z")


def test_update_of_a_middle_and_of_the_last_entry(registry: MachineRegistry, path: Path) -> None:
    write(path, HAND_WRITTEN)
    registry.update("mid-box", options={"port": 7})
    registry.update("team-lab", options={"user": "cy"})
    text = path.read_text()
    assert cut(cut(text, "mid-box"), "team-lab") == cut(cut(HAND_WRITTEN, "mid-box"), "team-lab")
    # the lines that followed the last entry still follow it
    assert text.index("    user: cy") < text.index("  # trailing comment after the last machine")
    assert registry.get("mid-box").options == {"port": 7}
    assert registry.get("team-lab").options["user"] == "cy"


def test_update_sending_back_unchanged_values_rewrites_nothing(registry: MachineRegistry, path: Path) -> None:
    # A form sends every option back; unchanged ones must keep their spelling ('ana', 0x16).
    write(path, HAND_WRITTEN)
    current = registry.get("gpu-box")
    registry.update("gpu-box", address=current.address, options={"user": "ana", "port": 22})
    assert path.read_text() == HAND_WRITTEN


def test_update_checks_what_changes(registry: MachineRegistry, path: Path) -> None:
    write(path, HAND_WRITTEN)
    with pytest.raises(InvalidSettings) as caught:
        registry.update("gpu-box", options={"port": "many"})
    assert caught.value.field == "options.port"
    with pytest.raises(InvalidSettings) as caught:
        registry.update("gpu-box", address="http://x")
    assert caught.value.field == "address"
    with pytest.raises(InvalidSettings) as caught:
        registry.update("gpu-box", options={"unheard-of": 1})
    assert caught.value.field == "options.unheard-of"
    # removing a key this code does not know is allowed
    registry.update("gpu-box", options={"notes": None})
    assert "notes" not in registry.get("gpu-box").options
    with pytest.raises(NotFound):
        registry.update("nope", address="x.lab")


def test_set_enabled_changes_one_line(registry: MachineRegistry, path: Path) -> None:
    write(path, HAND_WRITTEN)
    machine = registry.set_enabled("mid-box", True)
    assert machine.enabled is True and registry.get("mid-box").enabled is True
    expected = HAND_WRITTEN.replace(
        "    enabled: false    # switched off for now", "    enabled: true     # switched off for now"
    )
    assert path.read_text() == expected
    stamp = path.stat().st_mtime_ns
    inode = path.stat().st_ino
    registry.set_enabled("mid-box", True)  # no change, no rewrite
    assert path.read_text() == expected
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (inode, stamp)


def test_set_enabled_adds_the_key_when_absent(registry: MachineRegistry, path: Path) -> None:
    write(path, "machines:\n  a:\n    kind: fake\n    address: a.lab\n    created: 2026-11-29T10:02:00Z\n")
    assert registry.get("a").enabled is True  # absent means enabled
    registry.set_enabled("a", False)
    assert path.read_text() == (
        "machines:\n  a:\n    kind: fake\n    address: a.lab\n    enabled: false\n    created: 2026-11-29T10:02:00Z\n"
    )


def test_a_machine_of_an_uninstalled_kind_can_be_listed_disabled_and_removed(
    registry: MachineRegistry, path: Path
) -> None:
    write(path, "machines:\n  old:\n    kind: mainframe\n    address: login.hpc\n    partition: gpu\n")
    assert registry.get("old").options == {"partition": "gpu"}
    assert registry.set_enabled("old", False).enabled is False
    with pytest.raises(InvalidSettings) as caught:
        registry.update("old", options={"partition": "cpu"})
    assert caught.value.field == "kind"
    registry.remove("old")
    assert registry.list() == [LOCAL_MACHINE]


def test_an_entry_shared_through_an_anchor_is_not_edited(registry: MachineRegistry, path: Path) -> None:
    text = "machines:\n  a: &same\n    kind: fake\n    address: a.lab\n  b: *same\n"
    write(path, text)
    with pytest.raises(Conflict, match="anchor"):
        registry.update("b", address="b.lab")
    assert path.read_text() == text


# -- removing ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpu-box", "mid-box", "team-lab"])
def test_remove_leaves_every_other_line_alone(registry: MachineRegistry, path: Path, name: str) -> None:
    write(path, HAND_WRITTEN)
    registry.remove(name)
    assert path.read_text() == cut(HAND_WRITTEN, name)
    assert name not in [m.name for m in registry.list()]
    with pytest.raises(NotFound):
        registry.remove(name)


def test_removing_the_first_machine_keeps_the_lines_about_the_next(registry: MachineRegistry, path: Path) -> None:
    # Nothing above the first entry: the lines that followed it need a new home under "machines:".
    tail = "\n  # about b\n  b:\n    kind: fake\n    address: b.lab\n"
    write(path, "machines:\n  a:\n    kind: fake\n    address: a.lab\n" + tail)
    registry.remove("a")
    assert path.read_text() == "machines:\n" + tail


def test_removing_every_machine_keeps_the_comments(registry: MachineRegistry, path: Path) -> None:
    write(path, HAND_WRITTEN)
    for name in ("gpu-box", "mid-box", "team-lab"):
        registry.remove(name)
    text = path.read_text()
    for line in HAND_WRITTEN.splitlines():
        if line.strip().startswith("#"):
            assert line in text
    assert registry.list() == [LOCAL_MACHINE]
    registry.add("again", "fake", "a.lab")  # and the file still takes a new machine
    assert [m.name for m in registry.list()] == ["local", "again"]
    assert "defaults:   # unknown top-level key, after machines\n  timeout: 3600\n# end of file\n" in path.read_text()


# -- fidelity of what the writer cannot see ---------------------------------------------------
def test_indentation_and_block_lists_are_kept(registry: MachineRegistry, path: Path) -> None:
    text = textwrap.dedent(
        """\
        machines:
            a:
                kind: fake
                address: a.lab
                hosts:
                  - one
                  - two
        """
    )
    write(path, text)
    registry.add("b", "fake", "b.lab")
    after = path.read_text()
    assert after.startswith(text)  # not re-indented to ruamel's default of 2
    assert after[len(text) :].startswith("    b:\n        kind: fake\n        address: b.lab\n")


def test_crlf_line_endings_are_kept(registry: MachineRegistry, path: Path) -> None:
    text = "# ours\r\nmachines:\r\n  a:\r\n    kind: fake\r\n    address: a.lab   # note\r\n\r\n  # about b\r\n"
    text += "  b:\r\n    kind: fake\r\n    address: b.lab\r\n"
    path.write_bytes(text.encode())
    registry.update("a", options={"port": 1})
    data = path.read_bytes()
    assert b"\r\r" not in data and data.count(b"\n") == data.count(b"\r\n")
    assert data.startswith(b"# ours\r\nmachines:\r\n  a:\r\n    kind: fake\r\n    address: a.lab   # note\r\n")
    assert data.endswith(b"\r\n\r\n  # about b\r\n  b:\r\n    kind: fake\r\n    address: b.lab\r\n")


def test_comments_above_a_document_start_are_kept(registry: MachineRegistry, path: Path) -> None:
    text = "# above the marker\n--- # the document\nmachines:\n  a:\n    kind: fake\n    address: a.lab\n"
    write(path, text)
    registry.add("b", "fake", "b.lab")
    assert path.read_text().startswith(text)


def test_file_mode_is_kept(registry: MachineRegistry, path: Path) -> None:
    write(path, HAND_WRITTEN)
    path.chmod(0o600)
    registry.add("b", "fake", "b.lab")
    assert path.stat().st_mode & 0o777 == 0o600


# -- a file that cannot be used ------------------------------------------------------------------
BROKEN = [
    ("machines:\n  a:\n    kind: fake\n    address: [x\n", 5, "expected ',' or ']'"),
    ("machines:\n  a:\n\tkind: fake\n", 3, "'\\t'"),
    ("# c\nmachines:\n  - a\n", 3, "'machines' must map machine names"),
    ("machines:\n  a:\n    kind: fake\n    address: a\n  b: 3\n", 5, "machine 'b' must be a mapping"),
    ("machines:\n  a:\n    kind: fake\n    address: a\n  b:\n    address: b\n", 5, "machine 'b' has no kind"),
    ("machines:\n  b:\n    kind: fake\n", 2, "machine 'b' has no address"),
    ("machines:\n  b:\n    kind: 3\n    address: b\n", 3, "kind must be non-empty text"),
    ("machines:\n  GPU_box:\n    kind: fake\n    address: b\n", 2, "machine name 'GPU_box' is not valid"),
    ("machines:\n  a:\n    kind: fake\n    address: a\n  a:\n    kind: fake\n    address: b\n", 5, "duplicate key"),
    ("- a\n- b\n", 1, "expected a mapping"),
    ("machines:\n  local:\n    kind: fake\n    address: a\n", 2, "'local' is the built-in machine"),
    ("machines:\n  a:\n    kind: fake\n    address: a\n    enabled: yes\n", 5, "enabled must be true or false"),
    ("machines:\n  a:\n    kind: fake\n    address: a\n    token: abc123def\n", 5, "Secret Manager"),
    ("# c\n---\nmachines:\n  a: 3\n", 4, "machine 'a' must be a mapping"),
    ("machines:\n  a:\n    kind: fake\x07\n", 3, "U+0007"),
]


@pytest.mark.parametrize(("text", "line", "problem"), BROKEN)
def test_an_invalid_file_is_reported_and_never_rewritten(
    registry: MachineRegistry, path: Path, text: str, line: int, problem: str
) -> None:
    write(path, text)
    for attempt in (
        registry.list,
        lambda: registry.get("a"),
        lambda: registry.add("new", "fake", "n.lab"),
        lambda: registry.update("a", address="x.lab"),
        lambda: registry.set_enabled("a", False),
        lambda: registry.remove("a"),
    ):
        with pytest.raises(ConfigFileError) as caught:
            attempt()
        assert caught.value.message.startswith(f"{path}, line {line}: "), caught.value.message
        assert problem in caught.value.message
        assert path.read_text() == text
    assert "abc123def" not in caught.value.message


def test_a_file_that_is_not_utf8(registry: MachineRegistry, path: Path) -> None:
    path.write_bytes(b"machines:\n  a:\n    kind: fake\n    address: \xff\n")
    with pytest.raises(ConfigFileError, match=r", line 4: not UTF-8"):
        registry.list()


# -- concurrent writers ------------------------------------------------------------------------
def test_a_stale_expected_version_is_refused(registry: MachineRegistry, path: Path) -> None:
    assert registry.add("a", "fake", "a.lab", expected_version="absent").name == "a"
    seen = registry.version()
    other = MachineRegistry(path)
    other.add("b", "fake", "b.lab", expected_version=seen)
    written = path.read_bytes()
    for attempt in (
        lambda: registry.add("c", "fake", "c.lab", expected_version=seen),
        lambda: registry.update("a", address="x.lab", expected_version=seen),
        lambda: registry.set_enabled("a", False, expected_version=seen),
        lambda: registry.remove("a", expected_version=seen),
    ):
        with pytest.raises(Conflict) as caught:
            attempt()
        assert "changed on disk" in caught.value.message and "reload" in caught.value.message
        assert caught.value.field is None
        assert path.read_bytes() == written
    registry.remove("a", expected_version=registry.version())
    assert [m.name for m in registry.list()] == ["local", "b"]


def test_a_hand_edit_between_read_and_write_is_not_overwritten(
    registry: MachineRegistry, path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(path, HAND_WRITTEN)
    edited = HAND_WRITTEN + "# someone typed this while we were saving\n"

    def now_with_a_hand_edit() -> str:  # runs inside add(), after the file was read
        write(path, edited)
        return "2026-11-29T10:09:00Z"

    monkeypatch.setattr(machines_module, "_now", now_with_a_hand_edit)
    with pytest.raises(Conflict, match="changed on disk"):
        registry.add("new", "fake", "n.lab")
    assert path.read_text() == edited


def test_a_held_lock_gives_a_clear_error(path: Path) -> None:
    write(path, HAND_WRITTEN)
    registry = MachineRegistry(path, lock_timeout=0.05)
    lock = filelock.FileLock(str(path) + ".lock")
    with lock:
        with pytest.raises(Conflict) as caught:
            registry.add("new", "fake", "n.lab")
        assert "another process" in caught.value.message and str(path) + ".lock" in caught.value.message
        assert len(registry.list()) == 4  # reading does not wait for the lock
    assert path.read_text() == HAND_WRITTEN
    registry.add("new", "fake", "n.lab")  # and once released, writing works
    assert registry.get("new").address == "n.lab"


WRITER = """
import sys
from jupyter_remote_compute import engines
from jupyter_remote_compute.machines.registry import MachineRegistry
sys.path.insert(0, {tests!r})
from test_machines import FakeEngine
engines._registry()["fake"] = FakeEngine
registry = MachineRegistry(__import__("pathlib").Path({path!r}))
for i in range({count}):
    registry.add(f"w{{sys.argv[1]}}-{{i}}", "fake", "h.lab")
"""


def test_writers_in_several_processes_lose_nothing(path: Path) -> None:
    write(path, HAND_WRITTEN)
    count, procs = 8, 4
    script = WRITER.format(tests=str(Path(__file__).parent), path=str(path), count=count)
    root = str(Path(jupyter_remote_compute.engines.__file__).parents[2])
    env = {"PYTHONPATH": root, "PATH": "/usr/bin:/bin"}
    running = [subprocess.Popen([sys.executable, "-c", script, str(n)], env=env) for n in range(procs)]
    assert [p.wait(timeout=120) for p in running] == [0] * procs
    names = {m.name for m in MachineRegistry(path).list()}
    assert {f"w{n}-{i}" for n in range(procs) for i in range(count)} <= names
    # the hand-written part is still there, untouched
    text = path.read_text()
    for n in range(procs):
        for i in range(count):
            text = cut(text, f"w{n}-{i}")
    assert text == HAND_WRITTEN


@pytest.fixture
def no_leftovers(path: Path) -> Iterator[None]:
    yield
    assert not [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_no_temporary_files_are_left(registry: MachineRegistry, no_leftovers: None) -> None:
    registry.add("a", "fake", "a.lab")
    registry.update("a", options={"port": 1})
    registry.remove("a")
