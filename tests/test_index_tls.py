"""A package index behind TLS from a private CA, as behind a company proxy that inspects TLS.

The test makes its own CA and a certificate for 127.0.0.1 (``package_index.PrivateCA``) and serves the
demo wheels over HTTPS on loopback (``tls_index``). Where the machine trusts that CA (pip's ``cert``,
the machine's ``index_ca_bundle``), a job's environment is built from it and ``machines check`` says
the index is trusted; where it does not, the job fails naming the certificate and the check says
untrusted, before any job. env.sh itself is run too: uv gets the system's store under the name it
knows, and pip's configured cert where SSL_CERT_FILE is not set.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import package_index
import pytest
import sshd_fixture

from jupyter_remote_compute.jobs.spec import JobSpec

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env
private_ca = package_index.private_ca
tls_index = package_index.tls_index
index = package_index.index

SCRIPT = "import rcdemo_a\nprint('value', rcdemo_a.VALUE)\n"


def _spec(machine: str) -> JobSpec:
    # an environment of its own per test (the exclusion is never met): none is found built already
    package = f"rcdemo-a!=0.{uuid.uuid4().int % 10**9}"
    env = {"UV_NO_CACHE": "1"}  # the index is asked, never a cache a test before filled
    data = {"machine": machine, "command": ["python", "fit.py"], "send": ["fit.py"], "env": env}
    return JobSpec.from_json({**data, "environment": {"packages": [package]}})


@pytest.fixture
def local(workspace: Path, make_service, tls_index, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The built-in machine, its installer pointed at the TLS index; SSL_CERT_FILE unset, so pip's
    cert (PIP_CERT) is what says which CAs it trusts."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.setenv("UV_DEFAULT_INDEX", tls_index.url)
    (workspace / "fit.py").write_text(SCRIPT)
    return make_service(workspace)


def test_the_built_in_machine_builds_from_an_index_its_pip_cert_trusts_and_its_check_says_so(
    local, private_ca, monkeypatch
):
    monkeypatch.setenv("PIP_CERT", str(private_ca.bundle))
    job = local.wait(local.submit(_spec("local")).job.id)
    assert job.state == "succeeded", job.reason
    assert "value a2" in local.read_log(job.id).data.decode()
    assert local.admin.check("local")["index"] == "trusted"


def test_the_built_in_machine_fails_naming_the_certificate_where_nothing_trusts_the_ca(local, private_ca, monkeypatch):
    monkeypatch.setenv("PIP_CERT", str(private_ca.system_roots))
    assert local.admin.check("local")["index"].startswith("untrusted (certificate verify failed")
    job = local.wait(local.submit(_spec("local")).job.id)
    assert job.state == "failed"
    assert "could not be built" in job.reason and "certificate" in job.reason, job.reason


@pytest.fixture
def ssh(workspace: Path, make_service, tls_index, ssh_agent_env):  # type: ignore[no-untyped-def]
    """An ssh machine whose index_url is the TLS index, and the test's CA bundle in its user's home."""
    (workspace / "fit.py").write_text(SCRIPT)
    bundle = ssh_agent_env.far_path(f"ca-{uuid.uuid4().hex}.pem")
    yield make_service(workspace), ssh_agent_env.options(ssh_transport="openssh", index_url=tls_index.url), bundle
    bundle.unlink(missing_ok=True)


def test_an_ssh_machine_builds_from_an_index_its_ca_bundle_option_trusts_and_its_check_says_so(ssh, private_ca):
    service, options, bundle = ssh
    bundle.write_bytes(private_ca.bundle.read_bytes())
    bundle.chmod(0o644)  # the machine's user reads it
    service.machines.add("box", "ssh", "127.0.0.1", {**options, "index_ca_bundle": str(bundle)})
    job = service.wait(service.submit(_spec("box")).job.id)
    assert job.state == "succeeded", job.reason
    assert "value a2" in service.read_log(job.id).data.decode()
    assert service.admin.check("box")["index"] == "trusted"


def test_an_ssh_machine_without_the_ca_fails_naming_the_certificate_and_its_check_says_untrusted(ssh):
    service, options, _ = ssh
    service.machines.add("box", "ssh", "127.0.0.1", options)
    assert service.admin.check("box")["index"].startswith("untrusted (certificate verify failed")
    job = service.wait(service.submit(_spec("box")).job.id)
    assert job.state == "failed"
    assert "could not be built" in job.reason and "certificate" in job.reason, job.reason


def _run_env_sh(tmp_path: Path, index_url: str, uv: str, **env: str) -> str:
    """env.sh as a job's command.sh runs it, building ``rcdemo-a`` with ``uv``; the command prints the
    uv trust settings it sees. Its output, the build's log."""
    import subprocess

    from jupyter_remote_compute.environments.environment import Environment, far_command, resolve

    resolved = resolve(Environment(packages=("rcdemo-a==1.0",)), tmp_path)
    work = tmp_path / "base" / "job-1" / "work"
    (work / "_remote_compute_env").mkdir(parents=True)  # as environment_inputs sends them
    for name, text in resolved.files.items():
        (work / "_remote_compute_env" / name).write_text(text)
    command = 'echo "command sees [${UV_SYSTEM_CERTS-}${UV_NATIVE_TLS-}]"; python -c "import rcdemo_a"'
    script = far_command(command, resolved, {"index_url": index_url}, uv=uv)
    (work.parent / "command.sh").write_text("#!/bin/sh\n" + script)
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    run = subprocess.run(
        ["sh", "../command.sh"], cwd=work, env={**base, **env}, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


@pytest.mark.parametrize(("help_names", "setting"), [("--system-certs", "UV_SYSTEM_CERTS"), ("", "UV_NATIVE_TLS")])
def test_uv_builds_with_the_systems_store_under_the_name_it_knows_and_the_command_keeps_none(
    tmp_path: Path, index, help_names: str, setting: str
):
    """A uv whose ``uv help`` names --system-certs gets UV_SYSTEM_CERTS; an older one UV_NATIVE_TLS."""
    from uv import find_uv_bin

    seen = tmp_path / "seen"
    uv = tmp_path / "uv"  # the real uv, recording what each call was given; its help as the version has it
    uv.write_text(
        "#!/bin/sh\n"
        f'echo "$1 [${{UV_SYSTEM_CERTS-}}|${{UV_NATIVE_TLS-}}]" >> {seen}\n'
        f'[ "$1" != help ] || {{ echo "{help_names}"; exit 0; }}\n'
        f'exec {find_uv_bin()} "$@"\n'
    )
    uv.chmod(0o755)
    out = _run_env_sh(tmp_path, index.url, str(uv))
    expected = "[1|]" if setting == "UV_SYSTEM_CERTS" else "[|1]"
    assert f"pip {expected}" in seen.read_text().splitlines(), seen.read_text()
    assert "command sees []" in out


def test_pips_configured_cert_is_what_uv_trusts_where_ssl_cert_file_is_not_set(tmp_path: Path, private_ca, tls_index):
    from uv import find_uv_bin

    conf = tmp_path / ".config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(f"[global]\ncert = {private_ca.bundle}\n")
    out = _run_env_sh(tmp_path, tls_index.url, find_uv_bin())
    assert ": built in " in out
