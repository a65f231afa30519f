"""Execute a notebook on the far side: the product's runner, sent with the job (this package is not there).

Usage: python run_notebook.py NOTEBOOK EXECUTED PARAMETERS_JSON [KERNEL]

Parameters go into a new cell (tagged ``injected-parameters``) after the cell tagged ``parameters``,
or first when none is tagged, as papermill places them. The executed notebook is written to EXECUTED
whether or not a cell fails, and, where this python has MLflow, logged as an artifact of the job's run,
so it comes back with a failed job too. A failing cell ends this with exit code 1 and, as the last line
of the log, that cell's number (1 = the notebook's first cell, as written) and its error.
Standard library only until nbclient is known to be here: a machine without it gets exit code 3 and
a line saying what to install.
"""

import importlib.util
import json
import os
import sys

EXIT_CELL_FAILED = 1
EXIT_MISSING = 3


def missing_modules():
    return [m for m in ("nbformat", "nbclient", "ipykernel") if importlib.util.find_spec(m) is None]


def inject(nb, parameters, nbformat):
    """Insert the parameters cell; returns the index of the cell it was put at (or None)."""
    cells = nb.cells
    for i in reversed(range(len(cells))):  # a notebook run before keeps its old injection: replace it
        if "injected-parameters" in cells[i].get("metadata", {}).get("tags", []):
            del cells[i]
    if not parameters:
        return None
    source = "# Parameters\n" + "".join(f"{name} = {value!r}\n" for name, value in parameters.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    at = 0
    for i, existing in enumerate(cells):
        if "parameters" in existing.get("metadata", {}).get("tags", []):
            at = i + 1
            break
    cells.insert(at, cell)
    return at


def failed_cell(nb, injected_at):
    """The first cell with an error output: its number in the notebook as written, and the error."""
    for i, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                number = i + 1 - (1 if injected_at is not None and i > injected_at else 0)
                if injected_at == i:
                    return "the injected parameters cell", f"{output.get('ename')}: {output.get('evalue')}"
                return f"cell {number}", f"{output.get('ename')}: {output.get('evalue')}"
    return None, None


def log_artifact(path):
    """Put the executed notebook into the job's MLflow store (a run of its own unless the notebook made one)."""
    if not os.environ.get("MLFLOW_TRACKING_URI") or importlib.util.find_spec("mlflow") is None:
        return
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient()
        runs = []
        for experiment in client.search_experiments():
            runs += client.search_runs(
                [experiment.experiment_id], max_results=1, order_by=["attributes.start_time DESC"]
            )
        if runs:
            run_id = max(runs, key=lambda r: r.info.start_time).info.run_id
            client.log_artifact(run_id, path, "notebook")
        else:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "Default"
            experiment = client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
            run = client.create_run(experiment_id)
            client.log_artifact(run.info.run_id, path, "notebook")
            client.set_terminated(run.info.run_id)
    except Exception as e:  # the notebook's result matters more than its copy in MLflow
        print(f"run-notebook: could not log the executed notebook to MLflow: {e}", file=sys.stderr)


def main(argv):
    if len(argv) < 3:
        print("usage: run_notebook.py NOTEBOOK EXECUTED PARAMETERS_JSON [KERNEL]", file=sys.stderr)
        return 2
    source, executed, parameters = argv[0], argv[1], json.loads(argv[2])
    kernel = argv[3] if len(argv) > 3 and argv[3] else None
    missing = missing_modules()
    if missing:
        if os.environ.get("JRC_IMAGE_DIGEST"):  # in a container: the image is what it is
            advice = (
                "add nbclient and ipykernel to the job's environment packages (built inside the image), "
                "or use an image that has them"
            )
            where = "the image's python"
        else:
            advice = f"install them there: {sys.executable} -m pip install nbclient ipykernel"
            where = "the python on this machine"
        print(
            f"run-notebook: {where} ({sys.executable}) lacks {', '.join(missing)}, "
            f"which running a notebook needs; {advice}",
            file=sys.stderr,
        )
        return EXIT_MISSING
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(source, as_version=4)
    injected_at = inject(nb, parameters, nbformat)
    kernel = kernel or nb.metadata.get("kernelspec", {}).get("name") or "python3"
    folder = os.path.dirname(os.path.abspath(source))
    client = NotebookClient(nb, kernel_name=kernel, timeout=None, resources={"metadata": {"path": folder}})
    failure = None
    try:
        client.execute()
    except CellExecutionError as e:
        failure = e
    finally:
        os.makedirs(os.path.dirname(os.path.abspath(executed)), exist_ok=True)
        nbformat.write(nb, executed)
        log_artifact(executed)
    if failure is not None:
        where, error = failed_cell(nb, injected_at)
        print(str(failure), file=sys.stderr)
        print(f"run-notebook: {source}: {where or 'a cell'} failed: {error or failure}", file=sys.stderr)
        return EXIT_CELL_FAILED
    print(f"run-notebook: {source}: every cell ran; executed notebook at {executed}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
