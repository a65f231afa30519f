"""Egress rules in .punica/policy.yaml: which files may leave for which machine, and a broken policy fails closed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from jupyter_remote_compute.errors import ConfigFileError, PolicyDenied
from jupyter_remote_compute.guards import check_egress
from jupyter_remote_compute.guards.policy import load_egress_rules


def _policy(workspace: Path, text: str) -> Path:
    path = workspace / ".punica" / "policy.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def _denied(policy: Path, machine: str, files: list[str]) -> PolicyDenied:
    with pytest.raises(PolicyDenied) as info:
        check_egress(policy, machine, True, files)
    return info.value


def _allowed(policy: Path, machine: str, files: list[str]) -> bool:
    try:
        check_egress(policy, machine, True, files)
    except PolicyDenied:
        return False
    return True


def _broken(policy: Path) -> ConfigFileError:
    with pytest.raises(ConfigFileError) as info:
        check_egress(policy, "gpu-box", True, ["train.py"])
    return info.value


# --------------------------------------------------------------------------- no policy, local machine


def test_missing_policy_allows_everything(workspace: Path) -> None:
    check_egress(workspace / ".punica" / "policy.yaml", "gpu-box", True, ["data/private/x.csv"])
    check_egress(workspace / ".punica" / "policy.yaml", "gpu-box", True, [])


def test_empty_policy_and_empty_rules_allow(workspace: Path) -> None:
    assert _allowed(_policy(workspace, "# nothing yet\n"), "gpu-box", ["a.csv"])
    assert _allowed(_policy(workspace, "rules:\n"), "gpu-box", ["a.csv"])
    assert _allowed(_policy(workspace, "rules: []\nowner: data-team\n"), "gpu-box", [])


def test_local_machine_is_never_denied(workspace: Path) -> None:
    policy = _policy(workspace, "rules:\n  - deny egress: remote\n")
    check_egress(policy, "local", False, ["data/private/x.csv"])
    check_egress(policy, "local", False, [])
    # The same rule stops the same files on a remote machine, so the pass above is not vacuous.
    assert not _allowed(policy, "gpu-box", ["data/private/x.csv"])


def test_malformed_policy_does_not_block_local(workspace: Path) -> None:
    policy = _policy(workspace, "rules:\n  - permit egress: remote\n")
    check_egress(policy, "local", False, ["a.csv"])
    _broken(policy)


# --------------------------------------------------------------------------- rule shapes


def test_bare_deny_stops_every_file_to_every_remote_machine(workspace: Path) -> None:
    policy = _policy(
        workspace,
        """
        # Nothing leaves this laptop.
        rules:
          - deny egress: remote
        """,
    )
    exc = _denied(policy, "gpu-box", ["train.py", "data/x.csv"])

    assert exc.field == "send"
    assert exc.to_json()["code"] == "policy_denied"
    assert ".punica/policy.yaml:3" in exc.message
    assert "gpu-box" in exc.message and "train.py" in exc.message
    assert not _allowed(policy, "team-lab", ["README.md"])


def test_bare_deny_stops_a_job_that_sends_no_files(workspace: Path) -> None:
    policy = _policy(workspace, "rules:\n  - deny egress: remote\n")
    exc = _denied(policy, "gpu-box", [])
    assert ".punica/policy.yaml:2" in exc.message and "gpu-box" in exc.message
    assert exc.field == "send"


def test_deny_with_paths_names_the_first_file_it_covers(workspace: Path) -> None:
    policy = _policy(
        workspace,
        """
        rules:
          - deny egress: remote
            paths:
              - data/private/**
        """,
    )
    exc = _denied(policy, "gpu-box", ["train.py", "data/public/a.csv", "data/private/b/c.csv", "data/private/d.csv"])

    assert "data/private/b/c.csv" in exc.message
    assert "data/private/d.csv" not in exc.message and "train.py" not in exc.message
    assert ".punica/policy.yaml:2" in exc.message
    assert _allowed(policy, "gpu-box", ["train.py", "data/public/a.csv", "data/privateer.csv"])
    # A job with no files sends only its command, which a path-scoped rule does not cover.
    assert _allowed(policy, "gpu-box", [])


def test_deny_with_machines_only_applies_to_those_machines(workspace: Path) -> None:
    policy = _policy(
        workspace,
        """
        rules:
          - deny egress: remote
            machines: [cloud-*, "spot-?"]
        """,
    )
    assert not _allowed(policy, "cloud-a100", ["train.py"])
    assert not _allowed(policy, "spot-1", [])
    assert _allowed(policy, "spot-12", ["train.py"])
    assert _allowed(policy, "gpu-box", ["train.py"])
    assert _allowed(policy, "my-cloud-box", [])


def test_paths_and_machines_in_one_rule_must_both_match(workspace: Path) -> None:
    policy = _policy(
        workspace,
        """
        rules:
          - deny egress: remote
            paths: ["data/pii/**"]
            machines: ["team-*"]
        """,
    )
    assert not _allowed(policy, "team-lab", ["data/pii/people.parquet"])
    assert _allowed(policy, "gpu-box", ["data/pii/people.parquet"])
    assert _allowed(policy, "team-lab", ["data/public.parquet"])


def test_bare_allow_permits_everything(workspace: Path) -> None:
    policy = _policy(workspace, "rules:\n  - allow egress: remote\n")
    assert _allowed(policy, "gpu-box", ["data/private/x.csv"])
    assert _allowed(policy, "gpu-box", [])


# --------------------------------------------------------------------------- last match wins


def test_later_allow_reopens_a_narrower_scope(workspace: Path) -> None:
    policy = _policy(
        workspace,
        """
        rules:
          - deny egress: remote
          - allow egress: remote
            paths: [src/**, configs/*.yaml]
        """,
    )
    assert _allowed(policy, "gpu-box", ["src/train.py", "src/models/vit.py", "configs/base.yaml"])
    exc = _denied(policy, "gpu-box", ["src/train.py", "configs/sweeps/big.yaml", "data/x.csv"])
    assert "configs/sweeps/big.yaml" in exc.message and ".punica/policy.yaml:2" in exc.message
    # With no files only path-less rules count: the bare deny still holds.
    assert not _allowed(policy, "gpu-box", [])


def test_later_allow_for_one_machine(workspace: Path) -> None:
    policy = _policy(
        workspace,
        """
        rules:
          - deny egress: remote
          - allow egress: remote
            machines: [gpu-box]
        """,
    )
    assert _allowed(policy, "gpu-box", ["data/x.csv"])
    assert _allowed(policy, "gpu-box", [])
    assert not _allowed(policy, "team-lab", ["data/x.csv"])
    assert not _allowed(policy, "team-lab", [])


def test_later_deny_overrides_earlier_allow_and_is_the_one_cited(workspace: Path) -> None:
    policy = _policy(
        workspace,
        """
        rules:
          - deny egress: remote
            paths: [data/**]
          - allow egress: remote
            paths: [data/**]
          - deny egress: remote
            paths: [data/secret/**]
        """,
    )
    assert _allowed(policy, "gpu-box", ["data/open/a.csv"])
    exc = _denied(policy, "gpu-box", ["data/secret/a.csv"])
    assert ".punica/policy.yaml:6" in exc.message
    assert ".punica/policy.yaml:2" not in exc.message


def test_rule_line_is_the_line_of_its_verb(workspace: Path) -> None:
    policy = _policy(
        workspace,
        """
        rules:
          - paths: [data/**]
            reason: raw data stays on premises
            deny egress: remote
        """,
    )
    assert ".punica/policy.yaml:4" in _denied(policy, "gpu-box", ["data/a.csv"]).message


# --------------------------------------------------------------------------- globs


@pytest.mark.parametrize(
    ("pattern", "path", "covered"),
    [
        ("data/private/**", "data/private/a/b/c.csv", True),
        ("data/private/**", "data/private-2/a.csv", False),
        ("data/private", "data/private/a.csv", True),  # a directory covers what is under it
        ("data/private/", "data/private/a/b.csv", True),
        ("**/*.csv", "a.csv", True),
        ("**/*.csv", "a/b/c.csv", True),
        ("**/*.csv", "a/b/c.csv.gz", False),
        ("*.csv", "a.csv", True),
        ("*.csv", "data/a.csv", False),  # * stays inside one directory
        ("data/*/raw/**", "data/2026/raw/x.bin", True),
        ("data/*/raw/**", "data/2026/11/raw/x.bin", False),
        ("data/**/raw/*", "data/raw/x.bin", True),  # ** may span no directory at all
        ("models/ckpt-[0-9].pt", "models/ckpt-7.pt", True),
        ("models/ckpt-[!0-9].pt", "models/ckpt-7.pt", False),
        ("notes?.md", "notes1.md", True),
        ("./secrets/**", "secrets/k.txt", True),
        ("/secrets/**", "secrets/k.txt", True),
    ],
)
def test_path_globs(workspace: Path, pattern: str, path: str, covered: bool) -> None:
    policy = _policy(workspace, f'rules:\n  - deny egress: remote\n    paths: ["{pattern}"]\n')
    assert _allowed(policy, "gpu-box", [path]) is not covered


def test_sent_paths_written_with_dot_slash_are_matched(workspace: Path) -> None:
    policy = _policy(workspace, "rules:\n  - deny egress: remote\n    paths: [data/**]\n")
    assert "data/x.csv" in _denied(policy, "gpu-box", ["./data/x.csv"]).message


# --------------------------------------------------------------------------- a shared file


def test_other_keys_and_rule_kinds_are_ignored_and_the_file_is_not_rewritten(workspace: Path) -> None:
    policy = _policy(
        workspace,
        """
        # Workspace policy, shared by several tools.
        version: 3
        owners: [ana, ben]
        review:
          required: true
        rules:
          - require review: pull-request     # another tool's rule
          - lint: strict
          - "free-form rule"
          - retention days: 30
          - allow egress: remote
            paths: [src/**]
          - deny egress: remote
            paths: [data/**]
        notifications: {slack: "#ml"}
        """,
    )
    before = policy.read_bytes()

    assert [(r.verb, r.line) for r in load_egress_rules(policy)] == [("allow", 11), ("deny", 13)]
    assert _allowed(policy, "gpu-box", ["src/a.py", "README.md"])
    assert "data/x.csv" in _denied(policy, "gpu-box", ["src/a.py", "data/x.csv"]).message
    assert policy.read_bytes() == before


# --------------------------------------------------------------------------- malformed → fail closed


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("rules:\n  - deny egress: remote\n  - [unclosed\n", 4, "not valid YAML"),
        ("rules:\n  - deny egress: remote\n bad: indent\n", 3, "not valid YAML"),
        ("rules:\n  - deny egress: remote\n    paths: [a]\n    paths: [b]\n", 4, "not valid YAML"),
        ("owner: me\nrules:\n  deny egress: remote\n", 3, "rules must be a list"),
        ("owner: me\nrules: deny egress\n", 2, "rules must be a list"),
        ("- deny egress: remote\n", 1, "top level must be a mapping"),
        ("rules:\n  - lint: strict\n  - permit egress: remote\n", 3, 'unknown egress rule "permit egress"'),
        ("rules:\n  - egress: deny\n", 2, 'unknown egress rule "egress"'),
        ("rules:\n  - deny egress: everything\n", 2, '"deny egress" takes "remote", not "everything"'),
        ("rules:\n  - allow egress:\n", 2, 'takes "remote", not nothing'),
        ("rules:\n  - deny egress: remote\n    paths: data/**\n", 3, "paths must be a list of globs"),
        ("rules:\n  - deny egress: remote\n    paths: [data/**, 3]\n", 3, "item 2 is 3, not a glob"),
        ("rules:\n  - deny egress: remote\n    paths: [{a: b}]\n", 3, "item 1 is a mapping"),
        ("rules:\n  - deny egress: remote\n    paths: ['']\n", 3, "paths must be a list of globs"),
        ("rules:\n  - deny egress: remote\n    machines: gpu-box\n", 3, "machines must be a list of globs"),
        ("rules:\n  - allow egress: remote\n    path: [public/**]\n", 3, 'unknown key "path"'),
        ("rules:\n  - deny egress: remote\n    allow egress: remote\n", 3, "two egress verbs"),
    ],
)
def test_malformed_policy_fails_closed_naming_file_and_line(
    workspace: Path, text: str, line: int, problem: str
) -> None:
    exc = _broken(_policy(workspace, text))
    assert exc.message.startswith(f".punica/policy.yaml:{line}: ")
    assert problem in exc.message
    assert exc.to_json()["code"] == "config_file"
    # Fails closed for a job with no files as well.
    with pytest.raises(ConfigFileError):
        check_egress(workspace / ".punica" / "policy.yaml", "gpu-box", True, [])


def test_unreadable_policy_fails_closed(workspace: Path) -> None:
    policy = workspace / ".punica" / "policy.yaml"
    policy.mkdir()  # exists, but is no file that can be read
    assert _broken(policy).message.startswith(".punica/policy.yaml: cannot be read")


def test_policy_outside_punica_is_named_by_its_path(tmp_path: Path) -> None:
    policy = tmp_path / "custom-policy.yaml"
    policy.write_text("rules:\n  - deny egress: remote\n", encoding="utf-8")
    assert f"{policy}:2" in _denied(policy, "gpu-box", ["a.csv"]).message
