"""The organization's quotas: what a hub user or group may use of its machines per month, set by an admin.

Kept in ``<state>/.punica/quotas.json``, written whole (``atomic_write``) under a file lock::

    {"quotas": {"user:rcbob": {"period": "month", "job_hours": 40, "gpu_hours": 10, "jobs": 2,
                               "grace_seconds": 300, "soft": false}, "group:rcteam": {...}}}

A quota holds any of ``gpu_hours`` and ``job_hours`` (summed over the calendar month, UTC, from the
organization's ledger) and ``jobs`` (running at once). The service checks them before it prepares or
starts a job (``OrgJobs``), so a submit that would pass one is refused before anything reaches the
machine; a running job that uses up a *hard* quota's hours gets a notice at 90 % and is stopped at
100 % once ``grace_seconds`` have passed; a ``soft`` quota only notices. A user's server never
enforces anything: only the service does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import Conflict, InvalidSettings, NotFound
from ..fsutil import SharedFileLock, atomic_write

QUOTAS_FILE = "quotas.json"
PERIODS = ("month",)
HOURS = ("gpu_hours", "job_hours")
LIMITS = (*HOURS, "jobs")
DEFAULT_GRACE = 300.0
#: A hard quota's hours this far used earn a running job a notice.
NOTICE_AT = 0.9
WHO = ("user", "group")


class QuotaExceeded(Conflict):
    """A submit that would pass a quota: which, what is used and what is left."""

    code = "quota_exceeded"


def quota_key(who: str, name: str) -> str:
    if who not in WHO:
        raise InvalidSettings(f"who: expected user or group, not {who!r}", field="who")
    if not isinstance(name, str) or not name.strip() or len(name) > 256:
        raise InvalidSettings(f"{who}: expected a hub {who}'s name", field=who)
    return f"{who}:{name}"


def check_quota(body: Mapping[str, Any]) -> dict[str, Any]:
    """A quota as an admin sends it, checked field by field; at least one limit."""
    if not isinstance(body, Mapping):
        raise InvalidSettings("expected a JSON object with gpu_hours, job_hours or jobs")
    unknown = sorted(set(body) - {*LIMITS, "period", "grace_seconds", "soft"})
    if unknown:
        raise InvalidSettings(f"{unknown[0]}: unknown setting of a quota", field=unknown[0])
    nulls = sorted(name for name, value in body.items() if value is None)
    if nulls:  # a limit the quota does not have is left out, never null
        raise InvalidSettings(f"{nulls[0]}: expected a value (leave it out for none)", field=nulls[0])
    period = body.get("period", "month")
    if not isinstance(period, str) or period not in PERIODS:
        raise InvalidSettings(f"period: {period!r} is not a period; use month", field="period")
    quota: dict[str, Any] = {"period": period}
    for name in HOURS:
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise InvalidSettings(f"{name}: expected hours (a number, 0 or more)", field=name)
            quota[name] = float(value)
    jobs = body.get("jobs")
    if jobs is not None:
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 0:
            raise InvalidSettings("jobs: expected how many jobs may run at once (a whole number)", field="jobs")
        quota["jobs"] = jobs
    if not any(name in quota for name in LIMITS):
        raise InvalidSettings("a quota needs gpu_hours, job_hours or jobs", field="job_hours")
    grace = body.get("grace_seconds", DEFAULT_GRACE)
    if isinstance(grace, bool) or not isinstance(grace, int | float) or grace < 0:
        raise InvalidSettings("grace_seconds: expected seconds (0 or more)", field="grace_seconds")
    soft = body.get("soft", False)
    if not isinstance(soft, bool):
        raise InvalidSettings("soft: expected true or false", field="soft")
    return {**quota, "grace_seconds": float(grace), "soft": soft}


def month_start(now: float) -> float:
    at = datetime.fromtimestamp(now, timezone.utc)
    return at.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


class Quotas:
    """The quotas file; every method blocks (the service calls it in a thread)."""

    def __init__(self, punica_dir: Path) -> None:
        self.path = punica_dir / QUOTAS_FILE
        self._lock = SharedFileLock(str(self.path) + ".lock", timeout=30)

    def all(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        quotas = data.get("quotas") if isinstance(data, dict) else None
        return {str(k): dict(v) for k, v in quotas.items() if isinstance(v, dict)} if isinstance(quotas, dict) else {}

    def applying(self, user: str, groups: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The quotas that bind ``user``: their own and their groups'."""
        keys = {f"user:{user}", *(f"group:{g}" for g in groups)}
        return {k: v for k, v in self.all().items() if k in keys}

    def set(self, who: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        key, quota = quota_key(who, name), check_quota(body)
        with self._lock:
            quotas = self.all()
            quotas[key] = quota
            self._write(quotas)
        return {"who": key, **quota}

    def remove(self, who: str, name: str) -> None:
        key = quota_key(who, name)
        with self._lock:
            quotas = self.all()
            if quotas.pop(key, None) is None:
                raise NotFound(f"no quota for {who} {name!r}")
            self._write(quotas)

    def _write(self, quotas: Mapping[str, Any]) -> None:
        atomic_write(self.path, json.dumps({"quotas": quotas}, indent=1, sort_keys=True).encode(), mode=0o600)


def describe(key: str) -> str:
    who, _, name = key.partition(":")
    return f"{who} {name}'s"


def refusal(key: str, limit: str, quota: Mapping[str, Any], used: float) -> QuotaExceeded:
    """The error of a submit refused by ``limit`` of the quota ``key``: which, used, left."""
    allowed = quota[limit]
    if limit == "jobs":
        return QuotaExceeded(
            f"quota exceeded: {describe(key)} jobs quota allows {allowed} running at once; {int(used)} running, "
            "0 left: wait for one to end or ask an admin to raise it"
        )
    left = max(0.0, allowed - used)
    return QuotaExceeded(
        f"quota exceeded: {describe(key)} {limit} quota is {allowed:g} h per {quota['period']}; "
        f"{used:.4f} h used, {left:.4f} h left: ask an admin to raise it, or wait for next {quota['period']}"
    )
