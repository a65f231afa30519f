"""The recorder's calls, each with the function that makes its record (``recorder.Call``).

The recorder program hands this table to the recorder, so the recorder imports none of the
functions it runs, and a request can name only a call that is here.
"""

from __future__ import annotations

from .parent_run import record_request
from .recorder import Call, CallTable

CALLS: CallTable = {Call.PIPELINE_PARENT_RUN: record_request}
