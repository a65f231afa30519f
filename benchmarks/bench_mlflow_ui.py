"""Open in MLflow: from the click (the tab's first request) to the run's page answered, with MLflow's UI
started ahead of use (the server's default when the workspace has a store) and without (on first use).

Not a test: it prints figures. A real ``jupyter server`` (tests/server_process.py) on a real sqlite store
holding one run; "the run's page" is the page the tab loads and the run it asks MLflow for
(``runs/get``), both through the proxy. With the UI started ahead, the click comes once the server's
log says the UI is ready (``--wait``: or that many seconds after the server answers, as a person
would click, whichever comes first). The load average is printed beside the figures.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_mlflow_ui.py [--runs N]
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from server_process import Server  # noqa: E402 - after the path is set

QUICKSTART = ROOT / "examples" / "quickstart"


def _get(port: int, path: str, token: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("GET", path, headers={"Authorization": f"token {token}"})
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"{path}: {response.status} {body[:300]!r}")
        return body
    finally:
        conn.close()


def one(prestart: bool, wait: float) -> float:
    """Seconds from the click to the run's page answered, in a fresh server."""
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory(prefix="bench-mlflow-ui-") as folder:
        tmp = Path(folder)
        workspace = tmp / "ws"
        (workspace / ".punica").mkdir(parents=True)
        uri = f"sqlite:///{tmp / 'mlflow.db'}"
        client = MlflowClient(uri)
        run = client.create_run(client.create_experiment("bench"), run_name="bench").info.run_id
        (tmp / "scratch").mkdir()
        args = (f"--RemoteComputeApp.mlflow_ui_prestart={prestart}",)
        server = Server(workspace, tmp / "scratch", uri, tmp / "server.log", extra_args=args)
        server.start()
        try:
            if prestart:
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline and "MLflow's UI is ready" not in server.log.read_text():
                    time.sleep(0.1)
            clicked = time.perf_counter()
            _get(server.port, "/remote-compute/mlflow-ui/", server.token)
            _get(server.port, f"/remote-compute/mlflow-ui/ajax-api/2.0/mlflow/runs/get?run_id={run}", server.token)
            return time.perf_counter() - clicked
        finally:
            server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--wait", type=float, default=120.0)
    args = parser.parse_args()
    for prestart in (False, True):
        times = [one(prestart, args.wait) for _ in range(args.runs)]
        label = "started ahead" if prestart else "on first use "
        print(
            f"{label}: click to the run's page {statistics.median(times):.2f} s median "
            f"({', '.join(f'{t:.2f}' for t in times)}; load {os.getloadavg()[0]:.1f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
