"""A job as the state file keeps it (``Job``, how it will end: ``Outcome``), its id and its times:
defined in ``schema/job.py``, below every package that reads them."""

from __future__ import annotations

from ..schema.job import Job, Outcome, new_job_id, parse_given_time, parse_time, utcnow

__all__ = ["Job", "Outcome", "new_job_id", "parse_given_time", "parse_time", "utcnow"]
