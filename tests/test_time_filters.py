"""``since``/``until`` on ``GET /remote-compute/jobs`` take what openapi.yaml describes: RFC 3339 date-times.

Every date-time the description allows is answered (a page, or a 400 naming the field for one that
has no UTC equivalent), never a server error; what is not a time is refused naming the field.
"""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError


async def _jobs(jp_fetch, **params: str):  # type: ignore[no-untyped-def]
    response = await jp_fetch("remote-compute", "jobs", params=params)
    return json.loads(response.body)


@pytest.mark.parametrize(
    "since",
    ["2026-01-31T00:00:00Z", "2026-01-31T00:00:00.5+05:30", "1970-01-01T00:00:00.123456-23:59", "2026-01-31"],
)
async def test_date_times_of_rfc_3339_give_a_page(jp_fetch, since: str) -> None:
    page = await _jobs(jp_fetch, since=since, until="9999-12-31T23:59:59Z")
    assert page["jobs"] == [] and page["next_cursor"] is None


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("since", "0001-01-01T00:00:00+23:59", "out of range once turned into UTC"),
        ("until", "9999-12-31T23:59:59-23:59", "out of range once turned into UTC"),
        ("since", "last tuesday", "is not an ISO 8601 time"),
    ],
)
async def test_a_time_that_cannot_be_used_is_refused_naming_its_field(jp_fetch, field: str, value: str, says: str):
    with pytest.raises(HTTPClientError) as e:
        await _jobs(jp_fetch, **{field: value})
    assert e.value.code == 400
    body = json.loads(e.value.response.body)
    assert body["field"] == field and says in body["message"], body
