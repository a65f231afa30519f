"""Sweeps: one job's work over a grid (or a random sample) of parameters, each trial a pipeline node.

A sweep is a pipeline run without edges (``runner.PipelineRunner.start_sweep``): its trials are nodes
of the built-in steps, at most ``max_parallel`` of them running at once; a trial whose parameters and
inputs are unchanged since its job succeeded is reused as any node is; its MLflow parent run has the
trials' runs as children. Here: reading ``--sweep`` values, drawing the trials and writing each one's
settings.

A parameter reaches a trial as the command says: ``{lr}`` in the command (or in a ``send`` or
``bring_back`` path) is replaced by the value, shell-quoted; every parameter is also the environment
variable of its own name (``$lr``); a notebook trial gets them as its parameters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import random
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidSettings
from ..steps.executor import SETTINGS as STEP_SETTINGS
from .early_stop import RULES, Objective
from .notebook import NOTEBOOK_STEP, typed_parameter
from .notebook import SETTINGS as NOTEBOOK_SETTINGS

TRAIN_STEP = "train-on-remote-machine"
#: More trials than this are refused unless the person confirms (``--yes``): a typo in a grid is cheap
#: to write and expensive to run.
CONFIRM_ABOVE = 1000
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DISTRIBUTION = re.compile(r"^(uniform|loguniform|int)\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\)$")


@dataclasses.dataclass(frozen=True)
class Axis:
    """One swept parameter: a list of values, or a range drawn from (``--sweep-random`` only)."""

    name: str
    values: tuple[str, ...] = ()
    distribution: tuple[str, float, float] | None = None  # (uniform | loguniform | int, low, high)

    def draw(self, rng: random.Random) -> str:
        if self.distribution is None:
            return rng.choice(self.values)
        kind, low, high = self.distribution
        if kind == "int":
            return str(rng.randint(int(low), int(high)))
        if kind == "loguniform":
            return f"{math.exp(rng.uniform(math.log(low), math.log(high))):.6g}"
        return f"{rng.uniform(low, high):.6g}"


def axes_from_json(parameters: Any, field: str = "parameters") -> list[Axis]:
    """The REST API's ``parameters``: name → a list of values, or a range as ``"loguniform(1e-4,1e-1)"``."""
    if not isinstance(parameters, Mapping) or not parameters:
        raise InvalidSettings(f"{field}: give an object of parameter names to their values", field=field)
    items = []
    for name, values in parameters.items():
        at = f"{field}.{name}"
        if isinstance(values, list) and values and all(isinstance(v, (str, int, float)) for v in values):
            if any(isinstance(v, str) and "," in v for v in values):
                raise InvalidSettings(f"{at}: a value holds a comma; give values without one", field=at)
            items.append(f"{name}=" + ",".join(str(v) for v in values))
        elif isinstance(values, str) and _DISTRIBUTION.match(values.strip()):
            items.append(f"{name}={values}")
        else:
            raise InvalidSettings(
                f"{at}: give a list of values (strings or numbers) or a range such as loguniform(1e-4,1e-1)",
                field=at,
            )
    try:
        return parse_axes(items, field)
    except InvalidSettings as e:  # name the parameter, not its place in a list the caller never wrote
        at = f"{field}.{items[int(e.field.rsplit('[', 1)[1].rstrip(']'))].split('=', 1)[0]}" if e.field else field
        raise InvalidSettings(at + ":" + e.message.split(":", 1)[1], field=at) from None


def parse_axes(items: Sequence[str], field: str = "sweep") -> list[Axis]:
    """``--sweep NAME=V1,V2,…`` or ``--sweep NAME=uniform(LOW,HIGH)`` (also ``loguniform``, ``int``)."""
    axes: dict[str, Axis] = {}
    for i, item in enumerate(items):
        at = f"{field}[{i}]"
        name, sep, text = item.partition("=")
        name, text = name.strip(), text.strip()
        if not sep or not NAME.match(name):
            raise InvalidSettings(
                f"{at}: {item!r}: write NAME=V1,V2,… (a Python-style name), e.g. lr=0.001,0.01,0.1", field=at
            )
        if name in axes:
            raise InvalidSettings(f"{at}: {name} is swept twice; give its values once", field=at)
        found = _DISTRIBUTION.match(text)
        if found:
            axes[name] = Axis(name, distribution=_distribution(found, at))
            continue
        values = tuple(v.strip() for v in text.split(","))
        if not text or not all(values):
            raise InvalidSettings(f"{at}: {name} has an empty value; write {name}=V1,V2,…", field=at)
        if len(set(values)) != len(values):
            raise InvalidSettings(f"{at}: {name} lists a value twice", field=at)
        axes[name] = Axis(name, values=values)
    return list(axes.values())


def _distribution(found: re.Match[str], at: str) -> tuple[str, float, float]:
    kind = found.group(1)
    try:
        low, high = float(found.group(2)), float(found.group(3))
    except ValueError:
        raise InvalidSettings(f"{at}: {found.group(0)}: the bounds must be numbers", field=at) from None
    if not low < high:
        raise InvalidSettings(f"{at}: {found.group(0)}: the low bound must be below the high one", field=at)
    if kind == "loguniform" and low <= 0:
        raise InvalidSettings(f"{at}: {found.group(0)}: loguniform needs bounds above 0", field=at)
    if kind == "int" and not (low.is_integer() and high.is_integer()):
        raise InvalidSettings(f"{at}: {found.group(0)}: int needs whole bounds", field=at)
    return kind, low, high


def draw_trials(axes: Sequence[Axis], random_count: int | None = None) -> list[dict[str, str]]:
    """Every combination of the axes' values, in order; or ``random_count`` trials, each drawing every
    parameter, from a seed made of the sweep itself so the same sweep draws the same trials again (and
    reuses the trials that succeeded)."""
    if not axes:
        raise InvalidSettings("sweep: give at least one --sweep NAME=V1,V2,…", field="sweep")
    if random_count is None:
        ranged = [a.name for a in axes if a.distribution is not None]
        if ranged:
            raise InvalidSettings(
                f"sweep: {ranged[0]} is a range, drawn only by a random sweep: add --sweep-random N", field="sweep"
            )
        return [dict(zip([a.name for a in axes], combo, strict=True)) for combo in _product(axes)]
    if random_count < 1:
        raise InvalidSettings("sweep_random: give a number of trials of 1 or more", field="sweep_random")
    seed = hashlib.sha256(json.dumps([dataclasses.astuple(a) for a in axes]).encode()).hexdigest()
    rng = random.Random(seed)
    trials: list[dict[str, str]] = []
    seen: set[tuple[str, ...]] = set()
    for _ in range(random_count * 20):  # choices can run out of new combinations before the count
        trial = {a.name: a.draw(rng) for a in axes}
        if tuple(trial.values()) not in seen:
            seen.add(tuple(trial.values()))
            trials.append(trial)
        if len(trials) == random_count:
            break
    return trials


def _product(axes: Sequence[Axis]) -> itertools.product[tuple[str, ...]]:
    return itertools.product(*(a.values for a in axes))


def check_count(trials: Sequence[Mapping[str, str]], confirmed: bool) -> None:
    if len(trials) > CONFIRM_ABOVE and not confirmed:
        raise InvalidSettings(
            f"sweep: {len(trials)} trials is more than {CONFIRM_ABOVE}; add --yes to run them all, "
            "or sweep fewer values",
            field="sweep",
        )


def _fill(text: str, params: Mapping[str, str], quote: bool) -> str:
    """``{name}`` replaced by the value (``${name}`` is the shell's and stays)."""

    def value(found: re.Match[str]) -> str:
        name = found.group(1)
        if name not in params:
            return found.group(0)
        return shlex.quote(params[name]) if quote else params[name]

    return re.sub(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}", value, text)


def _mentions(text: str, name: str) -> bool:
    return bool(re.search(rf"(?<!\$)\{{{name}\}}|\${name}\b|\$\{{{name}\}}", text))


def unused_parameters(settings: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    """The parameters a command job never mentions (``{name}``, ``$name`` or ``${name}``): they reach
    it only as environment variables, which a script may read, or may not."""
    if "notebook" in settings:
        return []
    command = settings.get("command")
    text = command if isinstance(command, str) else " ".join(command or [])
    return [n for n in names if not _mentions(text, n)]


def params_label(params: Mapping[str, str]) -> str:
    """A trial's parameters as a person reads them: ``lr=0.01 depth=3``."""
    return " ".join(f"{k}={v}" for k, v in params.items())


def trial_settings(settings: Mapping[str, Any], params: Mapping[str, str], index: int) -> dict[str, Any]:
    """One trial's step settings: the sweep's, with its parameters put where the command says."""
    trial = dict(settings)
    label = params_label(params)
    trial["name"] = f"{settings.get('name') or 'sweep'} [{label}]"
    for field in ("send", "bring_back"):
        if trial.get(field):
            trial[field] = [_fill(p, params, quote=False) for p in trial[field]]
    if "notebook" in settings:
        typed = {k: typed_parameter(v) for k, v in params.items()}
        trial["parameters"] = {**(settings.get("parameters") or {}), **typed}
        notebook = str(settings["notebook"])
        trial["executed"] = f"{notebook[: -len('.ipynb')]}.trial-{index}.ipynb"
        return trial
    command = settings["command"]
    if isinstance(command, str):
        trial["command"] = _fill(command, params, quote=True)
    else:
        trial["command"] = [_fill(word, params, quote=False) for word in command]
    trial["env"] = {**(settings.get("env") or {}), **params}
    return trial


def sweep_document(
    settings: Mapping[str, Any], trials: Sequence[Mapping[str, str]]
) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """The pipeline of the sweep's trials (``trial-1`` …, no edges) and each trial's parameters by node.

    Two trials that would bring back the same path are refused: the second would replace the first's
    outputs, and neither could be reused after.
    """
    step = NOTEBOOK_STEP if "notebook" in settings else TRAIN_STEP
    taken = NOTEBOOK_SETTINGS if step == NOTEBOOK_STEP else STEP_SETTINGS
    for name in settings:
        if name not in taken:
            raise InvalidSettings(f"{name}: a sweep's trials do not take {name} yet; leave it out", field=name)
    nodes, params_of, landing = [], {}, {}
    for index, params in enumerate(trials, start=1):
        node_id = f"trial-{index}"
        trial = trial_settings(settings, params, index)
        for path in trial.get("bring_back") or []:
            if path in landing:
                raise InvalidSettings(
                    f"bring_back: {landing[path]} and {node_id} would both bring back {path}; put a parameter "
                    "in its path, e.g. model-{lr}.pkl",
                    field="bring_back",
                )
            landing[path] = node_id
        nodes.append({"id": node_id, "step": step, "settings": trial, "position": {"x": 0, "y": 120 * index}})
        params_of[node_id] = dict(params)
    return {"version": 1, "nodes": nodes, "edges": []}, params_of


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """A sweep ready to start: its name, the pipeline of its trials and each one's parameters, how it
    runs, and what the person starting it should be told."""

    name: str
    document: dict[str, Any]
    parameters: dict[str, dict[str, str]]
    max_parallel: int = 4
    objective: Objective | None = None
    early_stop: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def trials(self) -> int:
        return len(self.parameters)


def plan(
    settings: Mapping[str, Any],
    axes: Sequence[Axis],
    *,
    random_count: int | None = None,
    max_parallel: int = 4,
    metric: str | None = None,
    early_stop: str | None = None,
    confirmed: bool = False,
) -> SweepPlan:
    """Every check a sweep makes before anything runs, and its trials: the one way each face starts one."""
    if isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1:
        raise InvalidSettings("max_parallel: give 1 or more trials at once", field="max_parallel")
    if early_stop is not None and early_stop not in RULES:
        raise InvalidSettings(f"early_stop: {early_stop!r}: the rule is {' or '.join(RULES)}", field="early_stop")
    if early_stop is not None and not metric:
        raise InvalidSettings(
            "early_stop: name the metric the trials are judged by (--sweep-metric loss)", field="early_stop"
        )
    objective = Objective.parse(metric) if metric else None
    trials = draw_trials(axes, random_count)
    check_count(trials, confirmed)
    warnings = tuple(
        f"the command never mentions {{{name}}} or ${name}: the trials get {name} only as an environment variable"
        for name in unused_parameters(settings, [a.name for a in axes])
    )
    document, parameters = sweep_document(settings, trials)
    name = str(settings.get("name") or " by ".join(a.name for a in axes))
    return SweepPlan(name, document, parameters, max_parallel, objective, early_stop, warnings)


#: What ``POST /remote-compute/pipelines/sweeps`` takes.
REQUEST_FIELDS = ("job", "parameters", "random", "max_parallel", "metric", "early_stop", "confirm")


def plan_from_json(body: Mapping[str, Any]) -> SweepPlan:
    """The REST API's sweep: ``job`` (the step's settings, ``{name}`` where a value goes) and
    ``parameters``, with ``random``, ``max_parallel``, ``metric``, ``early_stop`` and ``confirm``."""
    unknown = sorted(set(body) - set(REQUEST_FIELDS))
    if unknown:
        raise InvalidSettings(f"{unknown[0]}: unknown setting; give {', '.join(REQUEST_FIELDS)}", field=unknown[0])
    job = body.get("job")
    if not isinstance(job, Mapping):
        raise InvalidSettings("job: give the trials' job settings (machine, command, …)", field="job")
    random_count = body.get("random")
    if random_count is not None and (isinstance(random_count, bool) or not isinstance(random_count, int)):
        raise InvalidSettings("random: give a whole number of trials", field="random")
    metric, early_stop = body.get("metric"), body.get("early_stop")
    for field, value in (("metric", metric), ("early_stop", early_stop)):
        if value is not None and not isinstance(value, str):
            raise InvalidSettings(f"{field}: expected a string", field=field)
    if not isinstance(body.get("confirm", False), bool):
        raise InvalidSettings("confirm: expected true or false", field="confirm")
    return plan(
        job,
        axes_from_json(body.get("parameters")),
        random_count=random_count,
        max_parallel=body.get("max_parallel", 4),
        metric=metric,
        early_stop=early_stop,
        confirmed=body.get("confirm", False),
    )
