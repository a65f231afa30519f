"""Checks a job passes before anything leaves this machine: no secret in its settings, egress allowed."""

from __future__ import annotations

from .policy import check_egress
from .screening import load_detectors, screen_settings

__all__ = ["check_egress", "load_detectors", "screen_settings"]
