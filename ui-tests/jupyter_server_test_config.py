"""Jupyter Server configuration for the Galata UI tests of the Compute panel.

A fresh temporary workspace per server start: `.punica/compute.yaml` with a hand-written
comment (the tests check a save keeps it), job scratch space, an MLflow sqlite store and a
plaintext keyring, all under one temp dir. `run.sh` starts the server through Playwright's
webServer (`jlpm start`).
"""

import os
import sys
import tempfile
from pathlib import Path

from jupyterlab.galata import configure_jupyter_server

c = get_config()  # noqa: F821 (provided by the config loader)

configure_jupyter_server(c)
c.ServerApp.allow_root = True  # CI runs as root
c.ServerApp.ip = "127.0.0.1"

base = Path(os.environ.get("REMOTE_COMPUTE_UI_TMP") or tempfile.mkdtemp(prefix="remote-compute-ui-"))
workspace = base / "workspace"
punica = workspace / ".punica"
punica.mkdir(parents=True, exist_ok=True)
(punica / "compute.yaml").write_text(
    "# Machines this workspace may train on\n"
    "# Hand-written note: the GPU box is shared, ask the team before long runs.\n"
    "machines:\n"
    "  old-box:  # kept for reference\n"
    "    kind: ssh\n"
    "    address: old-box.invalid\n"
    "    enabled: false\n"
    "    created: 2026-11-29T10:02:00Z\n"
)
# The tests read compute.yaml back through this path.
(base / "compute.yaml.path").write_text(str(punica / "compute.yaml"))

# REMOTE_COMPUTE_UI_JOBS=100000: that many old jobs in the state file before the server starts, for
# the job list spec's first-paint figure (named "old <i>", apart from the jobs the specs seed).
prepared = int(os.environ.get("REMOTE_COMPUTE_UI_JOBS") or 0)
if prepared:
    sys.path.insert(0, str(Path(__file__).parent))
    from seed_jobs import seed_jobs

    seed_jobs(punica / "jobs.json", prepared, prefix="pre", name="old")

# Tokens go to a real keyring backend, in a temp dir (plaintext: tests only).
os.environ.setdefault("PYTHON_KEYRING_BACKEND", "keyrings.alt.file.PlaintextKeyring")
os.environ.setdefault("XDG_DATA_HOME", str(base / "xdg-data"))

c.ServerApp.root_dir = str(workspace)
c.RemoteComputeApp.workspace = str(workspace)
c.RemoteComputeApp.scratch_dir = str(base / "scratch")
c.RemoteComputeApp.mlflow_tracking_uri = f"sqlite:///{base / 'mlflow.db'}"
c.RemoteComputeApp.poll_interval = 0.5
c.RemoteComputeApp.cancel_grace = 2.0
