"""A job of two nodes on the organization's Slurm machine, on the real hub and a real two-node cluster.

rcadmin adds the two-node Slurm bed (``slurm_nodes.py``, each node a network namespace) as the
organization's ``team-pair``; rcbob submits a job asking for both nodes to his own server, which runs it
through the service. The organization's ledger counts its hours on each node: its line says two nodes,
and the admin's usage (the service's API, his terminal's table and CSV) shows node-hours twice its
job-hours. The same job on the organization's ssh machine is refused at submit, naming its kind.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sshd_fixture
import test_organization
import test_slurm_two_nodes
from hub_fixture import ADMIN_USER, Hub
from slurm_fixture import SlurmBed
from test_organization import _as_user, _service, _through, add_slurm_machine, run_through_server

sshd_bed = sshd_fixture.sshd_bed
org = test_organization.org  # the hub the group shares (hub_fixture.shared_organization), emptied at the end
two_nodes = test_slurm_two_nodes.two_nodes
team_ssh = test_organization.team_ssh


@pytest.fixture(scope="module")
def team_pair(org: tuple[Hub, Path], two_nodes: SlurmBed) -> Iterator[str]:
    """rcadmin adds the two-node cluster's login node as the organization's Slurm machine."""
    yield add_slurm_machine(org[0], "team-pair", two_nodes)
    two_nodes.cancel_all()


def test_a_job_of_two_nodes_counts_its_hours_on_each_in_the_organizations_usage(
    org: tuple[Hub, Path], team_pair: str, two_nodes: SlurmBed
) -> None:
    hub, state = org
    server = hub.start_server("rcbob")
    spec = {
        "machine": team_pair,
        "command": "echo on $(hostname); sleep 2",
        "resources": {"nodes": 2, "launcher": "plain"},
    }
    job, log = run_through_server(server, spec)
    job_id = job["id"]
    assert job["state"] == "succeeded" and job["machine"] == f"org:{team_pair}", (job, log)
    assert log.count("on ") >= 2, log  # the command ran on each node

    # The organization's ledger: one line of this job, holding both nodes.
    lines = [json.loads(line) for line in (state / ".punica" / "usage.jsonl").read_text().splitlines() if line]
    (line,) = [entry for entry in lines if entry["job"] == f"rcbob/{job_id}"]
    assert (line["user"], line["machine"], line["nodes"], line["gpus"]) == ("rcbob", team_pair, 2, 0), line

    # The admin's usage: the service's sums, his terminal's CSV and table.
    admin = hub.user_token(ADMIN_USER)
    rows = _service(hub, "GET", "api/usage?all_users=1&group_by=user,machine", admin).json()["rows"]
    (row,) = [r for r in rows if (r["user"], r["machine"]) == ("rcbob", team_pair)]
    # Each sum is rounded to 6 places on its own: twice a rounded value may be 1.5e-6 off the other.
    assert row["job_hours"] > 0 and row["node_hours"] == pytest.approx(2 * row["job_hours"], abs=2e-6), row
    terminal = hub.start_server(ADMIN_USER)
    as_csv = _as_user(terminal, "usage", "--all-users", "--by", "user,machine", "--csv")
    assert as_csv.returncode == 0, as_csv.stderr
    (from_csv,) = [r for r in csv.DictReader(io.StringIO(as_csv.stdout)) if r["machine"] == team_pair]
    assert float(from_csv["node_hours"]) == pytest.approx(2 * float(from_csv["job_hours"]), abs=2e-6), from_csv
    as_table = _as_user(terminal, "usage", "--all-users", "--by", "user,machine")
    assert as_table.returncode == 0 and "NODE-H" in as_table.stdout.splitlines()[0].split(), as_table


def test_several_nodes_on_the_organizations_ssh_machine_are_refused_naming_its_own_kind(
    org: tuple[Hub, Path], team_ssh: str
) -> None:
    """The user's server admits a job from the kind the organization's machine really is."""
    server = org[0].start_server("rcbob")
    spec = {"machine": team_ssh, "command": "true", "resources": {"nodes": 2, "launcher": "plain"}}
    refused = _through(server, "POST", "jobs", json=spec)
    assert refused.status_code == 400 and refused.json()["field"] == "resources.nodes", refused.text
    assert f"org:{team_ssh} is a ssh machine, which runs a job on one node, not 2" in refused.json()["message"]
