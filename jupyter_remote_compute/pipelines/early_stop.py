"""A sweep's objective, followed live, and median stopping: a trial worse than the median of the others
at the same step is stopped, the step and the values said in its reason.

The points are the ones the trials log to MLflow on their machines, read by the jobs' own live metrics
(``jobs/metrics.py``: each poll brings what a watched job appended), so judging costs no round trip of
its own. Each trial's history is kept here for the life of the drive, a finished trial's included: the
others are judged against it.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from typing import Literal

from ..errors import InvalidSettings
from ..jobs.metrics import MetricWatch

Goal = Literal["min", "max"]
#: The rule ``--early-stop`` takes (the only one, for now).
RULES = ("median",)
#: At a step, how many other trials must have a value for a verdict: the median of one is that trial.
MIN_OTHERS = 2


@dataclasses.dataclass(frozen=True)
class Objective:
    """The metric a sweep is judged by, and whether lower or higher is better."""

    metric: str
    goal: Goal = "min"

    @classmethod
    def parse(cls, text: str, field: str = "sweep_metric") -> Objective:
        """``loss`` (lower is better), ``loss:min`` or ``accuracy:max``."""
        metric, _, goal = text.partition(":")
        if not metric.strip():
            raise InvalidSettings(f"{field}: name the metric the trials log, e.g. loss or accuracy:max", field=field)
        if goal not in ("", "min", "max"):
            raise InvalidSettings(f"{field}: {text!r}: the goal after ':' is min or max", field=field)
        return cls(metric.strip(), goal or "min")  # type: ignore[arg-type]

    def worse(self, value: float, than: float) -> bool:
        return value > than if self.goal == "min" else value < than

    def best(self, values: Mapping[str, float]) -> str | None:
        """The key of the best value (a trial's node id), None when there is none."""
        if not values:
            return None
        pick = min if self.goal == "min" else max
        return pick(values, key=lambda k: values[k])


def median_verdict(objective: Objective, histories: Mapping[str, Mapping[int, float]], node: str) -> str | None:
    """Why ``node`` should stop, or None: at the latest step it logged that enough other trials logged too
    (never its first step), its value is worse than the median of theirs."""
    mine = histories.get(node) or {}
    steps = sorted(mine)[1:]
    for step in reversed(steps):
        others = [h[step] for other, h in histories.items() if other != node and step in h]
        if len(others) < MIN_OTHERS:
            continue
        median = statistics.median(others)
        if not objective.worse(mine[step], median):
            return None
        return (
            f"stopped early: {objective.metric} {mine[step]:.4g} at step {step} is worse than the median "
            f"{median:.4g} of the {len(others)} other trials at that step"
        )
    return None


class TrialMetrics:
    """Each trial's points of the objective's metric, by step, from the jobs' live metrics."""

    def __init__(self, metrics: MetricWatch, objective: Objective) -> None:
        self.metrics = metrics
        self.objective = objective
        self.histories: dict[str, dict[int, float]] = {}
        #: Trials whose job ended and whose last points were taken: not looked at again.
        self.finished: set[str] = set()
        self._cursors: dict[str, str] = {}

    def look(self, jobs: Mapping[str, str]) -> bool:
        """Keep watching these trials' jobs (node id → job id) and take their new points; True when a
        trial's latest value changed."""
        changed = False
        for node, job_id in jobs.items():
            self.metrics.watch(job_id)
            page = self.metrics.read(job_id, self._cursors.get(node))
            if page.reset:
                self.histories.pop(node, None)
            history = self.histories.setdefault(node, {})
            for point in page.points:
                if point.key == self.objective.metric and point.value is not None:
                    history[point.step] = point.value
                    changed = True
            if page.cursor:
                self._cursors[node] = page.cursor
        return changed

    def latest(self) -> dict[str, list[float]]:
        """Each trial's last ``[step, value]``, for the run's record (the sweep's view)."""
        return {node: [step := max(h), h[step]] for node, h in self.histories.items() if h}
