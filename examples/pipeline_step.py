"""Run the "Train on a Remote Machine" step the way a pipeline tool does.

A pipeline tool knows nothing about this package: it finds steps through the
entry point group ``punica.mlops.steps``, shows each step's settings form from
its JSON Schema, and calls the step's executor (``"module:function"``) with the
settings a person filled in and a context naming the workspace.

    python examples/pipeline_step.py                      # on examples/quickstart, this machine
    python examples/pipeline_step.py path/to/workspace --machine gpu-box

Run it twice: the second run takes the first run's trained job instead of training again.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import entry_points
from pathlib import Path
from pkgutil import resolve_name
from typing import Any

HERE = Path(__file__).resolve().parent


def discover_steps() -> dict[str, dict[str, Any]]:
    """Every step any installed package offers, by id."""
    steps = {}
    for entry_point in entry_points(group="punica.mlops.steps"):
        description = entry_point.load()
        steps[description["id"]] = description
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workspace", nargs="?", default=str(HERE / "quickstart"))
    parser.add_argument("--machine", default="local")
    parser.add_argument("--wait", default="10m", help="how long this run waits for the job")
    args = parser.parse_args(argv)

    step = discover_steps()["train-on-remote-machine"]
    print(f"step: {step['label']} ({step['id']})")
    print("settings schema:")
    print(json.dumps(step["settings"], indent=2))

    settings = {
        "machine": args.machine,
        "command": "python train.py",
        "send": ["train.py", "data/*.csv"],
        "bring_back": ["model.pkl", "metrics.json"],
        "wait": args.wait,
        "name": "pipeline example",
    }
    try:
        import jsonschema  # what a pipeline designer does before it saves the form
    except ImportError:
        pass
    else:
        jsonschema.validate(settings, step["settings"])

    run_step = resolve_name(step["executor"])  # "module:function"

    def on_log(data: bytes) -> None:
        sys.stdout.write(data.decode(errors="replace"))
        sys.stdout.flush()

    try:
        result = run_step(settings, {"workspace": args.workspace, "on_log": on_log})
    except Exception as error:
        # Every error of the step has a stable `code`; `not_trained` also carries job_id, state and reason.
        code = getattr(error, "code", type(error).__name__)
        print(f"step failed [{code}]: {error}", file=sys.stderr)
        if code == "not_trained" and error.state in ("queued", "sending", "running", "collecting"):
            print(f"job {error.job_id} keeps running; run the pipeline again to pick it up", file=sys.stderr)
        return 1
    print("result:")
    print(json.dumps(result.to_json(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
