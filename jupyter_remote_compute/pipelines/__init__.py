"""Pipelines of steps run by the server: the ``*.rcpipeline`` document, its runner, notebooks as jobs.

- ``document``: parse, validate (cycles, settings against each step's JSON Schema, inputs nobody
  provides, unknown step ids) and write the pipeline document;
- ``runner``: run it, each node a job through ``JobService``, with a record of its own per run;
- ``notebook``: the job that executes a notebook on its machine (``farside/run_notebook.py``);
- ``sweep``: a job's work over a grid of parameters, each trial a node of a run without edges;
- ``handlers``: ``/remote-compute/pipelines/runs``.
"""

from __future__ import annotations

from .document import Pipeline, PipelineInvalid, Problem, dump_pipeline, load_pipeline, parse_pipeline, validate
from .notebook import NOTEBOOK_STEP, notebook_spec, parse_parameters, typed_parameter

__all__ = [
    "NOTEBOOK_STEP",
    "Pipeline",
    "PipelineInvalid",
    "Problem",
    "dump_pipeline",
    "load_pipeline",
    "notebook_spec",
    "parse_parameters",
    "parse_pipeline",
    "typed_parameter",
    "validate",
]
