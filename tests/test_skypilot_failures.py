"""SkyPilot's failures said plainly: no usable infra names `sky check`, what was tried and why; a failed
catalogue download is named as a network failure.

The words are checked against failures as SkyPilot 0.14 reports them (its NoCloudAccessError, and
requests' error when its catalogue cannot be fetched from GitHub). With SkyPilot installed, a job on
a SkyPilot machine with no credentials at all fails with such a reason (``sky_client``: a private
HOME, no cloud set up).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from skypilot_fixture import sky_client, sky_home
from waiting import wait_for

from jupyter_remote_compute.engines.skypilot_failures import no_infra_message, plain_failure, request_failure
from jupyter_remote_compute.jobs.spec import JobSpec

__all__ = ["sky_client", "sky_home"]  # fixtures used by name

CATALOG_FAILURE = (
    "Traceback (most recent call last):\n"
    '  File "sky/catalog/common.py", line 212, in read_catalog\n'
    "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='raw.githubusercontent.com', port=443): "
    "Max retries exceeded with url: /skypilot-org/skypilot-catalog/master/catalogs/v8/aws/vms.csv "
    '(Caused by NameResolutionError("<urllib3.connection.HTTPSConnection object at 0x7f>: '
    "Failed to resolve 'raw.githubusercontent.com' ([Errno -3] Temporary failure in name resolution)\"))"
)
NO_CLOUD = (
    "sky.exceptions.NoCloudAccessError: Cloud access is not set up. Run: sky check\n"
    "  AWS: disabled. Reason: AWS credentials are not set. Run `aws configure`."
)


def test_no_usable_infra_says_run_sky_check_what_was_tried_and_skypilots_reason() -> None:
    said = plain_failure(NO_CLOUD, "aws")
    assert said.startswith("no cloud SkyPilot can use: run `sky check` (tried aws: ")
    assert "AWS credentials are not set" in said
    assert "Traceback" not in said and "\n" not in said


def test_a_catalogue_download_that_fails_on_a_machine_with_no_infra_asks_for_sky_check() -> None:
    # What `sky check` found decides: no infra, so credentials come first, with the network's own words.
    said = plain_failure(CATALOG_FAILURE, "aws", no_infra=True)
    assert said.startswith("no cloud SkyPilot can use: run `sky check` (tried aws: ")
    assert "Failed to resolve 'raw.githubusercontent.com'" in said


def test_a_catalogue_download_that_fails_with_infra_set_up_is_named_a_network_failure() -> None:
    said = plain_failure(CATALOG_FAILURE, "aws", no_infra=False)
    assert said.startswith("SkyPilot could not download its cloud catalogue from raw.githubusercontent.com")
    assert "a network failure" in said and "sky check" in said
    assert "Traceback" not in said and len(said) < 700


def test_other_failures_keep_skypilots_own_last_line() -> None:
    said = plain_failure("Traceback:\n  File x\nsky.exceptions.ResourcesUnavailableError: no A100 in us-east-1", "aws")
    assert said == "sky.exceptions.ResourcesUnavailableError: no A100 in us-east-1"
    assert no_infra_message("every cloud", "none set up") == (
        "no cloud SkyPilot can use: run `sky check` (tried every cloud: none set up)"
    )


def _failed_request(error: BaseException) -> object:
    """A failed request as ``sky.api_status`` gives it: SkyPilot's own Request, its error set and encoded."""
    from sky.server.requests import payloads, requests

    request = requests.Request(
        request_id="r1",
        name="exec",
        entrypoint=print,
        request_body=payloads.RequestBody(),
        status=requests.RequestStatus.FAILED,
        created_at=0.0,
        user_id="u",
    )
    request.set_error(error)
    return request.encode()


def test_a_catalogue_that_cannot_be_downloaded_is_a_sentence_naming_the_host_and_sky_check() -> None:
    """The request's error as SkyPilot's server keeps it, from the exception requests raises when the
    catalogue's host does not resolve: a sentence, not the HTTP client's nested reprs."""
    pytest.importorskip("sky")
    import socket

    import requests
    import urllib3
    from urllib3.exceptions import MaxRetryError, NameResolutionError

    host = "raw.githubusercontent.com"
    pool = urllib3.HTTPSConnectionPool(host, 443)
    cause = NameResolutionError(host, pool.ConnectionCls(host, 443), socket.gaierror(-3, "Temporary failure"))
    url = "/skypilot-org/skypilot-catalog/master/catalogs/v8/aws/vms.csv"
    payload = _failed_request(requests.exceptions.ConnectionError(MaxRetryError(pool, url, cause)))
    said = request_failure(payload, "aws", no_infra=False)
    assert said.startswith(f"SkyPilot could not download its cloud catalogue from {host}: a network failure ("), said
    assert "`sky check`" in said and f"Failed to resolve '{host}'" in said
    assert "Caused by" not in said and '("' not in said and "HTTPSConnection" not in said
    # Any other failure keeps SkyPilot's own words, in one line.
    other = request_failure(_failed_request(ValueError("No instance type p5.48xlarge found.")), "aws")
    assert other == "No instance type p5.48xlarge found."


@pytest.mark.timeout(900)
def test_a_job_on_a_skypilot_machine_with_no_credentials_fails_naming_sky_check(
    sky_client: Path, make_service, quickstart: Path
) -> None:
    service = make_service(quickstart)
    service.machines.add("cloud", "skypilot", "aws", {})
    job = service.submit(JobSpec.from_json({"machine": "cloud", "command": "true", "name": "no credentials"})).job

    def ended() -> str | None:
        service.advance(job.id)
        now = service.get(job.id)
        return now.state if now.state in ("failed", "lost", "succeeded") else None

    assert wait_for(ended, 600, "the job on a cloud with no credentials to end", interval=1.0) == "failed"
    reason = service.get(job.id).reason or ""
    assert "sky check" in reason and "tried aws" in reason, reason
    assert "Traceback" not in reason
