"""Schemathesis against the live organization service, driven by its own document (``org/openapi.yaml``).

A hub of its own (``hub_fixture.py``), so what the fuzzer adds, removes and sets (machines, the default
machine, quotas, jobs) touches no other test's state. The service runs under ``loopback_only.py``: no
machine the fuzzer makes up is reached outside this host. It is fuzzed twice with a fixed seed: as a
member (``use``, through the group), then as the admin, whose run reaches the admin routes. Held to:
no 5xx (but a machine's documented failure), every response as the document says (status and schema),
every request that breaks the document refused.
"""

from __future__ import annotations

import time
from pathlib import Path

import hub_fixture
import pytest
from api_fuzzing import run_schemathesis
from hub_fixture import ADMIN_USER, REPO, SERVICE, HubBed

import jupyter_remote_compute

hub_bed = hub_fixture.hub_bed
SPEC = Path(jupyter_remote_compute.__file__).parent / "org" / "openapi.yaml"
SEED = 39
#: Per operation and phase: small, so both runs together take about 20 s (with the hub's start).
MAX_EXAMPLES = 20


@pytest.mark.timeout(900)
def test_the_organization_service_survives_fuzzing_and_keeps_its_document(hub_bed: HubBed, tmp_path: Path) -> None:
    state = tmp_path / "organization"
    command = ["python", str(REPO / "tests" / "loopback_only.py"), "-m", "jupyter_remote_compute.cli",
               "organization", "--state-dir", str(state)]  # fmt: skip
    hub = hub_bed.start(
        command,
        service_environment={
            "JUPYTER_REMOTE_COMPUTE_SECRETS_STORE": "file",
            "JUPYTER_REMOTE_COMPUTE_SECRETS_FILE": str(state / "secrets.json"),
            # loopback_only.py guards the service's own sockets, not an ssh client's: machines use paramiko.
            "JUPYTER_REMOTE_COMPUTE_SSH_TRANSPORT": "paramiko",
        },
    )
    results = {}
    try:
        url = f"{hub.service_url}/services/{SERVICE}"  # as a user's server reaches it (REMOTE_COMPUTE_ORG_URL)
        for user in ("rcalice", ADMIN_USER):
            report = tmp_path / f"report-{user}"
            report.mkdir()
            started = time.monotonic()
            result = run_schemathesis(
                SPEC, url, hub.user_token(user), "org_schemathesis_hooks",
                seed=SEED, max_examples=MAX_EXAMPLES, report_dir=report, timeout=600,
                # A GET without a token is answered with the hub's login (302, documented): not followed,
                # as from the service's own address the hub's login page is not there.
                options=["--max-redirects", "0"],
            )  # fmt: skip
            print(f"schemathesis as {user}: {result.cases} cases, {result.failures} failures "
                  f"in {time.monotonic() - started:.0f} s")  # fmt: skip
            results[user] = result
    finally:
        hub.stop()
    for user, result in results.items():
        assert result.returncode == 0 and result.failures == 0, (user, result.output[-20000:])
        assert result.cases > 0, (user, result.output[-3000:])
