"""``openapi.yaml``'s schemas of the boundary types, generated from the models.

    python -m jupyter_remote_compute.schema.openapi --write   # after changing a model
    python -m jupyter_remote_compute.schema.openapi --check   # fails when the file has drifted

The paths stay written by hand; the schemas named in ``COMPONENTS`` (and those they use) are written
after a marker line at the end of the file, in OpenAPI 3.0's dialect (``nullable`` rather than a
``null`` type). A type reads in one shape and is written in another where they differ: ``Resources``
is what a request may hold (``memory: 32G`` or MiB), ``StoredResources`` what the server writes back.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter

from .error import Error
from .job import HIDDEN, Job, JobSummary, Shown, State, StateNotice, SubmitResult
from .machine import Machine, MachineInput, MachinePatch
from .pipeline import HIDDEN as RUN_HIDDEN
from .pipeline import NodeRun, PipelineRun, PipelineRunStarted, Problem, SweepStarted
from .pool import Pool, PoolInput
from .spec import JobRequest, JobSpec

SPEC = Path(__file__).parent.parent / "openapi.yaml"
MARKER = (
    "    # Generated from jupyter_remote_compute/schema/ by `python -m jupyter_remote_compute.schema.openapi"
    " --write`: change the models, not what follows.\n"
)
#: The schemas generated, by name: the type, and whether it is read (``validation``) or written.
COMPONENTS: dict[str, tuple[Any, str]] = {
    "JobRequest": (JobRequest, "validation"),
    "JobSpec": (JobSpec, "validation"),
    "Job": (Job, "serialization"),
    "JobSummary": (JobSummary, "serialization"),
    "SubmitResult": (SubmitResult, "serialization"),
    "State": (State, "serialization"),
    # What a job's webhooks are POSTed on each change of its state (JobSpec.notify; jobs/notify.py).
    "StateNotice": (StateNotice, "serialization"),
    "Machine": (Machine, "serialization"),
    "MachineInput": (MachineInput, "validation"),
    "MachinePatch": (MachinePatch, "validation"),
    "Pool": (Pool, "serialization"),
    "PoolInput": (PoolInput, "validation"),
    "PipelineRun": (PipelineRun, "serialization"),
    "PipelineNodeRun": (NodeRun, "serialization"),
    "PipelineRunStarted": (PipelineRunStarted, "serialization"),
    "SweepStarted": (SweepStarted, "serialization"),
    "PipelineProblem": (Problem, "serialization"),
    "Error": (Error, "serialization"),
}
_REF = "#/components/schemas/"
#: The types a person fills in a form (the front end's New Job and machine forms draw these).
FORMS: dict[str, Any] = {"JobRequest": JobRequest, "MachineInput": MachineInput}


def _name(pydantic_name: str) -> str:
    """``Resources-Input`` is what a request holds (``Resources``), ``Resources-Output`` what is written back."""
    base, _, mode = pydantic_name.partition("-")
    return "Stored" + base if mode == "Output" else base


def _openapi_30(node: Any) -> Any:
    """JSON Schema 2020-12 as OpenAPI 3.0 reads it: ``nullable``, ``enum`` for ``const``, one ``example``."""
    if isinstance(node, list):
        return [_openapi_30(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _openapi_30(v) for k, v in node.items() if k != "title"}
    if "$ref" in node:
        ref = {"$ref": _REF + _name(node.pop("$ref").removeprefix(_REF))}
        node = {**node, "allOf": [ref]} if node else ref  # a $ref takes no sibling keywords in 3.0
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "examples" in node:
        node["example"] = node.pop("examples")[0]
    options = node.get("anyOf")
    if options is not None and {"type": "null"} in options:
        rest = [o for o in options if o != {"type": "null"}]
        del node["anyOf"]
        node["nullable"] = True
        if len(rest) == 1 and "$ref" in rest[0]:
            node["allOf"] = rest  # a $ref takes no sibling keywords in 3.0
        elif len(rest) == 1:
            node = {**rest[0], **node}
            if "enum" in node and None not in node["enum"]:  # 3.0: nullable admits null only if enum lists it
                node["enum"] = [*node["enum"], None]
        else:
            node["anyOf"] = rest
    return node


def _without(record: dict[str, Any], hidden: tuple[str, ...]) -> dict[str, Any]:
    """A record's schema as the API shows it: without the fields it keeps to itself."""
    return {
        **record,
        "properties": {k: v for k, v in record["properties"].items() if k not in hidden},
        "required": [k for k in record["required"] if k not in hidden],
    }


def _public_job(job: dict[str, Any], shown: dict[str, Any]) -> dict[str, Any]:
    """The API's ``Job``: the record but for ``HIDDEN``, with what ``Shown`` adds."""
    job = _without(job, HIDDEN)
    return {
        **job,
        "description": "a job as the API shows it: its record (the state file's), its display name and, while "
        "it is sent, its progress",
        "properties": {**job["properties"], **shown["properties"]},
        "required": [*job["required"], *shown["required"]],
    }


def schemas() -> dict[str, Any]:
    """Every generated schema by name, as openapi.yaml holds them."""
    asked = {**COMPONENTS, "Shown": (Shown, "serialization")}
    inputs = [(name, mode, TypeAdapter(type_)) for name, (type_, mode) in asked.items()]
    keys, definitions = TypeAdapter.json_schemas(inputs, ref_template=_REF + "{model}")  # type: ignore[arg-type]
    found = {_name(name): _openapi_30(schema) for name, schema in definitions.get("$defs", {}).items()}
    for adapter in (a for _, _, a in inputs):
        _keep_optional(found, adapter.core_schema)
    for (name, _mode), schema in keys.items():
        schema = _openapi_30(schema)
        if "$ref" in schema:  # a class: its definition is in $defs, under its own name
            target = schema["$ref"].removeprefix(_REF)
            if target != name:
                found[name] = found.pop(target)
                _rename_refs(found, target, name)
        else:
            found[name] = schema
    found["Job"] = _public_job(found["Job"], found.pop("Shown"))
    found["PipelineRun"] = _without(found["PipelineRun"], RUN_HIDDEN)
    return dict(sorted(_used(found).items()))


def _keep_optional(found: dict[str, Any], core: Any) -> None:
    """A TypedDict's ``NotRequired`` keys out of its ``required``: pydantic reckons them by the config of
    the type holding it, whose ``json_schema_serialization_defaults_required`` makes every key required."""
    if isinstance(core, dict):
        cls = core.get("cls") if core.get("type") == "typed-dict" else None
        schema = found.get(getattr(cls, "__name__", ""))
        if schema is not None and "required" in schema:
            optional = {k for k, field in core["fields"].items() if not field.get("required", True)}
            schema["required"] = [k for k in schema["required"] if k not in optional]
            if not schema["required"]:  # OpenAPI 3.0: a list of at least one
                del schema["required"]
        for value in core.values():
            _keep_optional(found, value)
    elif isinstance(core, list):
        for value in core:
            _keep_optional(found, value)


def form_schema(name: str) -> dict[str, Any] | None:
    """The JSON Schema (2020-12, its types in ``$defs``) of a type a form draws, as a request reads it;
    None for a name ``FORMS`` does not hold."""
    type_ = FORMS.get(name)
    return None if type_ is None else TypeAdapter(type_).json_schema(mode="validation")


def _used(found: dict[str, Any]) -> dict[str, Any]:
    """The components asked for and what they refer to (a type replaced in its JSON Schema is not)."""
    used, todo = set(), list(COMPONENTS)
    while todo:
        name = todo.pop()
        if name not in used:
            used.add(name)
            todo.extend(_refs(found[name]))
    return {name: schema for name, schema in found.items() if name in used}


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"].removeprefix(_REF)] if "$ref" in node else []
        return own + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def _rename_refs(node: Any, old: str, new: str) -> None:
    if isinstance(node, dict):
        if node.get("$ref") == _REF + old:
            node["$ref"] = _REF + new
        for value in node.values():
            _rename_refs(value, old, new)
    elif isinstance(node, list):
        for value in node:
            _rename_refs(value, old, new)


def _hand_written(text: str) -> str:
    """The file up to the generated schemas."""
    return text.split(MARKER, 1)[0]


def render(text: str) -> str:
    """openapi.yaml's text with its generated schemas as the models say."""
    body = yaml.safe_dump(schemas(), sort_keys=False, allow_unicode=True, width=120, default_flow_style=False)
    indented = "".join("    " + line if line.strip() else line for line in body.splitlines(keepends=True))
    return _hand_written(text) + MARKER + indented


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_remote_compute.schema.openapi", description=__doc__)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="write the generated schemas into openapi.yaml")
    action.add_argument("--check", action="store_true", help="fail when openapi.yaml differs from the models")
    args = parser.parse_args(argv)
    text = SPEC.read_text(encoding="utf-8")
    wanted = render(text)
    if args.write:
        if wanted != text:
            SPEC.write_text(wanted, encoding="utf-8")
        return 0
    if wanted != text:
        print(f"{SPEC}: its schemas differ from jupyter_remote_compute/schema/; run {parser.prog} --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
