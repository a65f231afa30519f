"""Agent machines from a terminal: the token shown once, rotated and revoked; the agent's own refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_cli import cli  # noqa: F401 - the fixture

from jupyter_remote_compute.engines.agent_hub import AgentHub


def test_adding_an_agent_machine_shows_its_token_once_and_keeps_a_hash(cli, quickstart: Path) -> None:  # noqa: F811
    added = json.loads(cli("machines", "add", "lab", "--kind", "agent", "--json").stdout)
    token = added["agent_token"]
    assert token.startswith("jrca_") and "--machine lab" in added["agent_command"]
    assert token not in added["agent_command"]
    hub = AgentHub(quickstart / ".punica").machine("lab")
    assert hub.accepts(token)
    assert not any(token in p.read_text(errors="replace") for p in (quickstart / ".punica").rglob("*") if p.is_file())

    rotated = json.loads(cli("machines", "agent-token", "lab", "--rotate", "--json").stdout)["agent_token"]
    assert hub.accepts(rotated) and not hub.accepts(token)
    cli("machines", "agent-token", "lab", "--revoke")
    assert not hub.accepts(rotated)
    refused = cli("machines", "agent-token", "local", "--rotate", check=False)
    assert refused.returncode == 1 and "not an agent machine" in refused.stderr
    cli("machines", "agent-token", "lab", "--rotate")
    cli("machines", "remove", "lab")
    assert not hub.has_token()


def test_the_agent_reads_its_token_from_a_private_file_stdin_or_the_environment_only(tmp_path: Path) -> None:
    def agent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "jupyter_remote_compute.cli", "agent", "--server", "http://127.0.0.1:9",
             "--machine", "lab", "--state-dir", str(tmp_path / "state"), *args],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )  # fmt: skip

    missing = agent()
    assert missing.returncode != 0 and "never read from the command line" in missing.stderr
    token_file = tmp_path / "token"
    token_file.write_text("jrca_x\n")
    os.chmod(token_file, 0o644)
    loose = agent("--token-file", str(token_file))
    assert loose.returncode != 0 and "chmod 600" in loose.stderr
    assert "--token" not in {a.split("=")[0] for a in ("--token-file", "--token-stdin")} - {
        "--token-file",
        "--token-stdin",
    }
