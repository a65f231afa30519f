"""A kind's faces come in through one registration only: the ``jupyter_remote_compute.faces`` entry points.

The plugin here is a real installed distribution (a ``.dist-info`` with its ``entry_points.txt`` on
the path), found by the same lookup as any other package's: its route is served by the real server,
its periodic task runs in the real poll loop, and its command runs in the real CLI, in a process of
its own. Without the distribution on the path, none of them exists.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_remote_compute.engines import faces

PLUGIN = """
from pathlib import Path

from jupyter_remote_compute.engines.faces import CliCommand, KindFaces, PeriodicTask


def _routes():
    from jupyter_remote_compute.handlers import PREFIX, RemoteComputeHandler, api

    class PingHandler(RemoteComputeHandler):
        @api
        async def get(self) -> None:
            self.reply({"pong": self.get_argument("say", "")})

    return [(rf"{PREFIX}/demo/ping", PingHandler)]


def _tick(server) -> None:
    mark = server.punica_dir / "demo-ticks"
    mark.write_text(str(int(mark.read_text() or 0) + 1 if mark.exists() else 1))


def _hello(args) -> int:
    print(f"hello {args.who} from {args.workspace}")
    return 0


FACES = KindFaces(
    routes=_routes,
    periodic=(PeriodicTask("ticking", _tick),),
    cli=(CliCommand("demo-hello", "greet", _hello, lambda p: p.add_argument("who")),),
)
"""


def _install_plugin(root: Path) -> Path:
    """A distribution ``demo-faces`` declaring the faces of kind ``demo``, as pip would leave it."""
    root.mkdir()
    (root / "demo_faces.py").write_text(textwrap.dedent(PLUGIN))
    info = root / "demo_faces-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-faces\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{faces.FACES_ENTRY_POINT_GROUP}]\ndemo = demo_faces:FACES\n")
    return root


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    return _install_plugin(tmp_path / "plugin")


@pytest.fixture
def installed(plugin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(plugin_dir))
    faces.forget_loaded()
    yield plugin_dir
    faces.forget_loaded()
    sys.modules.pop("demo_faces", None)


@pytest.fixture
def jp_server_config(installed: Path, jp_server_config: dict) -> dict:
    return jp_server_config


async def test_a_kinds_route_and_periodic_task_are_served_from_its_registration(
    jp_fetch, server_workspace: Path
) -> None:
    response = await jp_fetch("remote-compute", "demo", "ping", params={"say": "hi"})
    assert json.loads(response.body) == {"pong": "hi"}
    # The route is one of the API's: jupyter_server's authentication holds for it as for the rest.
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("remote-compute", "demo", "ping", headers={"Authorization": ""})
    assert refused.value.code == 403
    ticks = server_workspace / ".punica" / "demo-ticks"
    deadline = asyncio.get_running_loop().time() + 30
    while not (ticks.exists() and int(ticks.read_text() or 0) >= 2):  # run again on each pass, not once
        assert asyncio.get_running_loop().time() < deadline, "the periodic task never ran twice"
        await asyncio.sleep(0.05)


def test_a_kinds_command_runs_in_the_cli_only_when_registered(plugin_dir: Path, quickstart: Path) -> None:
    def cli(*pythonpath: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*pythonpath, os.environ.get("PYTHONPATH", "")])}
        return subprocess.run(
            [sys.executable, "-m", "jupyter_remote_compute.cli", "demo-hello", "world"],
            cwd=quickstart, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    registered = cli(str(plugin_dir))
    assert registered.returncode == 0, registered.stderr
    assert registered.stdout.strip() == f"hello world from {quickstart}"
    unregistered = cli()
    assert unregistered.returncode == 2 and "invalid choice: 'demo-hello'" in unregistered.stderr


def test_this_packages_kinds_register_the_same_way(installed: Path) -> None:
    """The agent's faces are a KindFaces like a plugin's, found by kind; a kind that adds none gets none."""
    every = faces.all_faces()
    assert {"agent", "demo"} <= set(every)
    assert "demo" not in faces.all_faces(plugins=False)  # this package's commands never scan metadata
    assert faces.faces_of("local") is faces.NO_FACES
    agent = faces.faces_of("agent")
    assert {c.name for c in agent.cli} == {"agent", "agent-token"} and agent.on_removed is not None
