"""The Galata test through the hub's login (``ui-tests/hub/``), on the JupyterHub bed of ``hub_fixture.py``.

    python tests/hub_ui.py [playwright args…]        (``ui-tests/run.sh --hub`` runs it, and a full run.sh)

Starts what the spec drives: the bed's hub with this package's organization service, the loopback sshd of
``sshd_fixture.py`` added by rcadmin as the organization's ssh machine ``team-ssh``, a soft quota of
rcalice's that her job uses up; then Playwright with
``ui-tests/playwright.hub.config.js``, told the hub's URL and the users' password in its environment
(``HUB_URL``, ``HUB_PASSWORD``, ``HUB_MACHINE``); then stops them all, whatever the spec did. Its status is
Playwright's. Without root, useradd, node, sshd or the built front end it skips (0) saying why, and in CI
(``CI=true``) fails, as ``required.py`` does for the pytest suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The bed's modules, and this clone's package before any installed one, as pytest's rootdir and conftest put them.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

import hub_fixture  # noqa: E402
import sshd_fixture  # noqa: E402
from hub_fixture import ADMIN_USER, REPO, loopback_session  # noqa: E402

UI_TESTS = REPO / "ui-tests"
MACHINE = "team-ssh"


def missing() -> str:
    """What the bed needs and this machine lacks ("" when nothing)."""
    needs = {
        "root, to add the hub's Linux users and spawn their servers": os.geteuid() == 0,
        "useradd (apt-get install passwd)": shutil.which("useradd") is not None,
        "node, for configurable-http-proxy and Playwright": shutil.which("node") is not None,
        f"Debian's {hub_fixture.DEBIAN_PYTHON}": os.path.exists(hub_fixture.DEBIAN_PYTHON),
        f"{sshd_fixture.SSHD} (apt-get install openssh-server)": os.path.exists(sshd_fixture.SSHD),
        "the built front end (jlpm build, or pip install -e .)": (
            REPO / "jupyter_remote_compute" / "labextension" / "package.json"
        ).exists(),
        "ui-tests/node_modules (ui-tests/run.sh installs it)": (UI_TESTS / "node_modules" / ".bin").is_dir(),
    }
    return "; ".join(what for what, present in needs.items() if not present)


def set_up_organization(hub: hub_fixture.Hub, ssh: sshd_fixture.TestBed) -> None:
    """rcadmin adds the loopback sshd as the organization's ssh machine, as the admin's form does, and gives
    rcalice a soft job-hours quota of about a second, so her job gets a notice (never stopped: soft)."""
    options = {k: v for k, v in ssh.options().items() if k in ("known_hosts", "ssh_config", "base_dir")}
    machine = {"name": MACHINE, "kind": "ssh", "address": "testbox", "options": options}
    session = loopback_session()
    session.headers["Authorization"] = f"token {hub.user_token(ADMIN_USER)}"
    added = session.post(hub.service("api/machines"), json=machine, timeout=60)
    if added.status_code != 201:
        raise RuntimeError(f"rcadmin could not add {MACHINE}: {added.status_code} {added.text}")
    quota = session.put(hub.service("api/quotas/user/rcalice"), json={"job_hours": 0.0003, "soft": True}, timeout=60)
    if quota.status_code != 200:
        raise RuntimeError(f"rcadmin could not set rcalice's quota: {quota.status_code} {quota.text}")


def run(playwright_args: list[str]) -> int:
    build, how = hub_fixture.build_hub()
    if build is None:
        print(f"hub_ui.py: the hub's venv and proxy could not be made: {how}", file=sys.stderr)
        return 1
    hub_fixture.ensure_users()
    with hub_fixture.users_held():
        state = Path(tempfile.mkdtemp(prefix="jrc-hub-ui-org-"))
        ssh = sshd_fixture.build_testbed()
        hub = None
        try:
            hub = hub_fixture.start_hub(build, **hub_fixture.organization_service(state))  # type: ignore[arg-type]
            set_up_organization(hub, ssh)
            environment = {**os.environ, "HUB_URL": hub.url, "HUB_PASSWORD": hub.password, "HUB_MACHINE": MACHINE}
            command = ["jlpm", "playwright", "test", "--config", "playwright.hub.config.js", *playwright_args]
            status = subprocess.run(command, cwd=UI_TESTS, env=environment).returncode
            if status != 0:
                # A login whose server did not come up says so only here: the spawner's and the servers' lines.
                print(f"hub_ui.py: the hub's log ends:\n{hub.log.read_text(errors='replace')[-6000:]}", file=sys.stderr)
            return status
        finally:
            if hub is not None:
                # the servers the browser's logins spawned
                hub.started.update((*hub_fixture.MEMBERS, hub_fixture.ADMIN_USER))
                hub.stop()
            ssh.stop()
            shutil.rmtree(state, ignore_errors=True)


def main() -> int:
    lacking = missing()
    if lacking:
        in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
        print(f"hub_ui.py: {'CI needs' if in_ci else 'skipped, missing'}: {lacking}", file=sys.stderr)
        return 1 if in_ci else 0
    return run(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
