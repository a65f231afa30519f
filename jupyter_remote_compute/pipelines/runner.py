"""Running a pipeline: each node a job on its machine through ``JobService``, in dependency order.

Independent branches run at once (a thread per node that is ready). A node's inputs are its own
``send`` plus what the nodes it depends on bring back, so the job key (``jobs/key.py``) covers
them: a node whose settings and inputs are unchanged and whose job succeeded is not run again
(``reused``), and one whose job is still under way is attached to. A node that fails stops the
nodes that need it (``not_run``, with the reason); cancelling a run cancels its running jobs.

A run's record (``runs.py``) is ``.punica/pipelines/<run id>.json``, written atomically under a lock file
(``fsutil``), with the driving process's identity: a run whose driver died (a server killed or
restarted) is taken up again by ``resume`` and attaches to its jobs where they are.
Everything here blocks; the server calls it from its worker threads, never from the IOLoop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from ..errors import Conflict, InvalidSettings, NotFound, NotTrained, RemoteComputeError, SecretStoreUnavailable
from ..guards import screen_settings
from ..jobs.job import Job, new_job_id, utcnow
from ..jobs.lifecycle import cancelled_by
from ..jobs.liveness import holder_alive, process_identity
from ..jobs.recording import PROGRAM as RECORDER
from ..jobs.service import JobService
from ..jobs.spec import JobSpec, check_relative_path
from ..people import local_person
from ..schema.pipeline import Sweep
from ..steps import describe_steps, parse_settings
from ..steps.executor import StepContext, run_spec, with_machine
from .document import Node, Pipeline, PipelineInvalid, Problem, declared_outputs, load_pipeline, order, validate
from .early_stop import Objective, TrialMetrics, median_verdict
from .notebook import NOTEBOOK_STEP, notebook_spec
from .runs import NODE_DONE, NODE_FINE, NodeRun, PipelineRun, RunStore
from .sweep import SweepPlan, params_label

log = logging.getLogger(__name__)

#: How often a sweep with an objective looks at its trials' new points (seconds).
JUDGE_EVERY = 1.0
#: What identifies a sweep (a start with the same attaches to it); the rest of its record is what it found.
SWEEP_DEFINITION = ("name", "max_parallel", "parameters", "metric", "goal", "early_stop")
#: Steps whose nodes the runner turns into jobs itself (on its service, so cancel reaches them).
BUILT_IN_STEPS = ("train-on-remote-machine", NOTEBOOK_STEP)
#: How long a cancelled run follows a job's cancel to its end (the machine's grace, a collection).
STOP_WAIT = 120.0


def known_steps() -> dict[str, dict[str, Any]]:
    """Every step a pipeline may use, by id: this package's, then other packages' entry points."""
    return {s["id"]: s for s in describe_steps(installed=True)}


class PipelineRunner:
    """Starts, drives, cancels and resumes pipeline runs on one ``JobService``."""

    def __init__(self, service: JobService, *, max_runs: int = 8) -> None:
        self.service = service
        self.workspace = service.workspace
        self.store = RunStore(self.workspace.punica_dir / "pipelines")
        self.identity = process_identity()
        self._pool = ThreadPoolExecutor(max_runs, thread_name_prefix="remote-compute-pipeline")
        self._stops: dict[str, threading.Event] = {}
        self._guard = threading.Lock()
        self._listeners: list[Callable[[PipelineRun], None]] = []

    # -- reading ---------------------------------------------------------------------------------
    def get(self, run_id: str) -> PipelineRun:
        return self.store.get(run_id)

    def list_runs(self) -> list[PipelineRun]:
        return self.store.runs()

    def add_listener(self, listener: Callable[[PipelineRun], None]) -> None:
        """Called (from the runner's threads) with a run each time it or one of its nodes changes."""
        self._listeners.append(listener)

    # -- the document ----------------------------------------------------------------------------
    def resolve(self, file: Any) -> tuple[str, Path]:
        """The pipeline file's workspace-relative path and where it is; outside the workspace is refused."""
        if not isinstance(file, str) or not file.endswith(".rcpipeline"):
            raise InvalidSettings("file: give the workspace path of a .rcpipeline file", field="file")
        path = Path(file)
        if path.is_absolute():
            try:
                file = str(path.resolve().relative_to(self.workspace.root.resolve()))
            except ValueError:
                raise InvalidSettings(f"file: {file} is not inside the workspace", field="file") from None
        rel = check_relative_path(file, "file")
        return rel, self.workspace.root / rel

    def validate(self, file: Any) -> Pipeline:
        """The pipeline, checked (``PipelineInvalid`` names every problem's node and field).

        Beyond the document's own checks, each built-in node's job spec is made and screened for
        secrets here, so a literal secret is refused before the run's record (which keeps the
        settings) is written, and a bad value is named by its node before any job starts.
        """
        rel, path = self.resolve(file)
        pipeline = load_pipeline(path)
        problems = self.problems(pipeline)
        if problems:
            raise PipelineInvalid(problems, rel)
        return pipeline

    def check_document(self, file: Any, document: Any) -> list[Problem]:
        """What is wrong with ``document`` (a pipeline as a canvas holds it, maybe unsaved) as the file
        ``file`` would be: the same problems a run of it would refuse, none of it written anywhere."""
        rel, _ = self.resolve(file)
        return self.problems(Pipeline.from_json(document, rel))

    def problems(self, pipeline: Pipeline) -> list[Problem]:
        """Every problem a run of ``pipeline`` would refuse, by node and field."""
        problems = validate(pipeline, known_steps(), self.workspace.root)
        reported = {
            p.node
            for p in problems
            if p.kind in ("invalid_setting", "missing_setting", "unknown_step", "outside_workspace")
        }
        for node in pipeline.nodes:
            if node.step not in BUILT_IN_STEPS or node.id in reported:
                continue
            try:
                spec, _ = self.node_spec(pipeline, node)
                screen_settings(spec.screened_settings(), self._stored_secrets)
            except RemoteComputeError as e:  # InvalidSettings, SecretInSettings: the message names the field
                problems.append(Problem(e.code, e.message, node.id, e.field))
        return problems

    def _stored_secrets(self) -> list[str]:
        try:
            return self.service.secrets.values()
        except SecretStoreUnavailable:
            return []

    # -- running ---------------------------------------------------------------------------------
    def start(self, file: Any, *, background: bool = True, user: str | None = None) -> tuple[PipelineRun, bool]:
        """Start a run of the file (or attach to the one of it under way); returns (run, attached).

        With ``background`` the run is driven in the runner's threads; else call ``drive``. ``user`` (a
        login, ``people.py``) submits its nodes' jobs; by default whoever runs this process.
        """
        rel, _ = self.resolve(file)
        pipeline = self.validate(rel)
        for existing in self.store.runs():
            if existing.file == rel and existing.active and holder_alive(existing.driver):
                return existing, True
        run = PipelineRun(
            id=new_job_id(),
            file=rel,
            pipeline=pipeline.to_json(),
            driver=self.identity,
            nodes={n.id: NodeRun() for n in pipeline.nodes},
            user=user or local_person(),
        )
        return self._begin(run, background), False

    def start_sweep(
        self, plan: SweepPlan, *, background: bool = False, user: str | None = None
    ) -> tuple[PipelineRun, bool]:
        """Start a sweep's run (``sweep.plan`` checked it and made its trials), or attach to the same sweep
        under way; without ``background``, call ``drive``. With an objective its trials' latest values are
        followed; with ``early_stop`` the ones that fall behind are stopped."""
        name, objective = plan.name, plan.objective
        source = f"sweep {name}"
        pipeline = Pipeline.from_json(plan.document, source)
        problems = self.problems(pipeline)
        if problems:
            raise PipelineInvalid(problems, source)
        sweep: Sweep = {
            "name": name,
            "max_parallel": plan.max_parallel,
            "parameters": plan.parameters,
            "metric": objective.metric if objective else None,
            "goal": objective.goal if objective else None,
            "early_stop": plan.early_stop,
        }
        for existing in self.store.runs():
            same = existing.sweep and all(existing.sweep.get(k) == sweep[k] for k in SWEEP_DEFINITION)
            if same and existing.active and holder_alive(existing.driver):
                return existing, True
        run = PipelineRun(
            id=new_job_id(),
            file="",
            pipeline=pipeline.to_json(),
            driver=self.identity,
            nodes={n.id: NodeRun() for n in pipeline.nodes},
            sweep=sweep,
            user=user or local_person(),
        )
        return self._begin(run, background), False

    def _begin(self, run: PipelineRun, background: bool) -> PipelineRun:
        self.store.put(run)
        self._emit(run)
        if background:
            self._pool.submit(self._drive_logged, run.id)
        return run

    def resume(self) -> list[str]:
        """Take up every run whose driver died (a server restarted); returns their ids."""
        taken = []
        for run in self.store.runs():
            if not run.active or holder_alive(run.driver):
                continue

            def take(r: PipelineRun) -> None:
                r.driver = self.identity

            self.store.change(run.id, take)
            taken.append(run.id)
            self._pool.submit(self._drive_logged, run.id)
        return taken

    def cancel(self, run_id: str, by: str = "user") -> PipelineRun:
        """Stop the run: nodes not started never start, running nodes' jobs are cancelled."""

        def request(run: PipelineRun) -> None:
            if not run.active:
                raise Conflict(f"pipeline run {run_id} has already ended ({run.state})")
            run.cancel_requested = by

        run = self.store.change(run_id, request)
        with self._guard:
            stop = self._stops.get(run_id)
        if stop is not None:
            stop.set()
        for node in run.nodes.values():
            if node.state == "running" and node.job_id:
                with contextlib.suppress(Conflict, NotFound):  # it ended meanwhile
                    self.service.cancel(node.job_id, by=by)
        if stop is None and not holder_alive(run.driver):
            # Nobody drives it: end it here.
            run = self.store.change(run_id, lambda r: self._finish(r))
        self._emit(run)
        return run

    def close(self) -> None:
        with self._guard:
            for stop in self._stops.values():
                stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- driving ---------------------------------------------------------------------------------
    def _emit(self, run: PipelineRun) -> None:
        for listener in self._listeners:
            try:
                listener(run)
            except Exception:
                log.exception("pipeline listener failed")

    def _drive_logged(self, run_id: str) -> None:
        try:
            self.drive(run_id)
        except Exception:
            log.exception("pipeline run %s stopped unexpectedly", run_id)

    def drive(self, run_id: str) -> PipelineRun:
        """Run every node in dependency order, independent ones at once; returns the ended run."""
        stop = threading.Event()
        with self._guard:
            self._stops[run_id] = stop
        try:
            run = self.store.get(run_id)
            pipeline = Pipeline.from_json(run.pipeline, run.label)
            ordered, _ = order(pipeline)
            # A sweep runs at most max_parallel trials at once; a pipeline, every node that is ready.
            at_once = run.sweep["max_parallel"] if run.sweep else len(ordered)
            judge = self._trial_metrics(run)
            if run.cancel_requested:
                stop.set()
            with ThreadPoolExecutor(max(1, len(ordered)), thread_name_prefix=f"pipeline-{run_id}") as nodes:
                running: dict[Future[None], str] = {}
                while True:
                    run = self.store.get(run_id)
                    if run.cancel_requested:
                        stop.set()
                    for node_id in ordered:
                        node = run.nodes[node_id]
                        if node.state not in ("waiting", "running") or node_id in running.values():
                            continue
                        needs = [run.nodes[n] for n in pipeline.upstream(node_id)]
                        blocked = [
                            n
                            for n, s in zip(pipeline.upstream(node_id), needs, strict=True)
                            if s.state in ("failed", "cancelled", "not_run")
                        ]
                        if stop.is_set():
                            self._set_node(run_id, node_id, state="cancelled", reason="the run was cancelled")
                        elif blocked:
                            why = run.nodes[blocked[0]].reason or run.nodes[blocked[0]].state
                            reason = f"not run: it needs {blocked[0]}, which {run.nodes[blocked[0]].state}: {why}"
                            if run.nodes[blocked[0]].state == "not_run":
                                reason = f"not run: it needs {blocked[0]}, which was not run"
                            self._set_node(run_id, node_id, state="not_run", reason=reason)
                        elif len(running) >= at_once:
                            continue
                        elif all(s.state in ("succeeded", "reused") for s in needs):
                            future = nodes.submit(
                                self._run_node, run_id, pipeline, pipeline.node(node_id), stop, run.user
                            )
                            running[future] = node_id
                    if not running:
                        after = self.store.get(run_id)
                        if all(n.state in NODE_DONE for n in after.nodes.values()):
                            break
                        if after.nodes == run.nodes:
                            break  # nothing can move (a cycle got past validation): end what is left
                        continue
                    done, _ = wait(running, timeout=JUDGE_EVERY if judge else None, return_when=FIRST_COMPLETED)
                    for future in done:
                        running.pop(future)
                        future.result()
                    if judge is not None:
                        self._judge(run_id, judge)
            if judge is not None:
                self._judge(run_id, judge)  # the points of the trials that ended last
            run = self.store.change(run_id, self._finish)
            self._record_parent(run)
            self._emit(run)
            return run
        finally:
            with self._guard:
                self._stops.pop(run_id, None)

    def _trial_metrics(self, run: PipelineRun) -> TrialMetrics | None:
        if not run.sweep or not run.sweep.get("metric"):
            return None
        return TrialMetrics(self.service.ctx.metrics, Objective(run.sweep["metric"], run.sweep["goal"]))

    def _judge(self, run_id: str, trials: TrialMetrics) -> None:
        """A sweep's trials' new points: their latest values into the run's record and, with early stopping,
        each running trial worse than the median of the others at its step stopped (its job cancelled)."""
        run = self.store.get(run_id)
        sweep = run.sweep or {}
        jobs = {
            node_id: node.job_id
            for node_id, node in run.nodes.items()
            if node.job_id and node_id not in trials.finished and node.state != "reused"
        }
        if trials.look(jobs):
            latest = trials.latest()
            self._emit(self.store.change(run_id, lambda r: (r.sweep or {}).update(latest=latest)))
        trials.finished.update(n for n in jobs if run.nodes[n].state in NODE_DONE)
        if sweep.get("early_stop") != "median" or run.cancel_requested:
            return
        for node_id, node in run.nodes.items():
            if node.state != "running" or not node.job_id or node_id in (sweep.get("stopped") or {}):
                continue
            verdict = median_verdict(trials.objective, trials.histories, node_id)
            if verdict is None:
                continue

            def stopped(r: PipelineRun, node_id: str = node_id, verdict: str = verdict) -> None:
                (r.sweep or {}).setdefault("stopped", {})[node_id] = verdict

            self.store.change(run_id, stopped)
            with contextlib.suppress(Conflict, NotFound):  # it ended meanwhile
                self.service.cancel(node.job_id, by="early stopping")

    def _record_parent(self, run: PipelineRun) -> None:
        """Start recording the run's MLflow parent run, its nodes' job runs as children (``parent_run.py``);
        the run's ``mlflow_run_id`` shows it once recorded.

        It goes where its steps' runs went: the organization's tracking server when every step's job was
        recorded there (``Job.tracking_uri``: they all ran on the organization's machines), else the user's
        own store with the steps' runs that are there (a run's parent is a run of its own store)."""
        from ..recording.parent_run import record_parent
        from ..recording.tracking import tracking_uri

        by_store: dict[str | None, dict[str, str]] = {}  # a store's URI (None: the user's own) -> its children
        for node_id, node in run.nodes.items():
            if node.job_id:
                with contextlib.suppress(NotFound):
                    job = self.service.get(node.job_id)
                    if job.mlflow_run_id:
                        by_store.setdefault(job.tracking_uri, {})[node_id] = job.mlflow_run_id
        organizations = next(iter(by_store)) if len(by_store) == 1 else None
        children = by_store.get(organizations, {})
        try:
            uri = organizations or tracking_uri(self.workspace.root, self.service.settings.tracking)
            record_parent(RECORDER, self.workspace, uri, run.to_json(), children, self.store.parent_id_path(run.id))
        except Exception as e:  # MLflow down must not lose the run's outcome
            log.warning("pipeline run %s: its MLflow parent run was not recorded: %s", run.id, e)

    @staticmethod
    def _finish(run: PipelineRun) -> None:
        for node in run.nodes.values():
            if node.state not in NODE_DONE:
                node.state, node.reason, node.ended = "cancelled", "the run was cancelled", utcnow()
        states = [n.state for n in run.nodes.values()]
        if all(s in NODE_FINE for s in states):
            run.state, run.reason = "succeeded", None
            if "stopped_early" in states:
                run.reason = f"{states.count('stopped_early')} of {len(states)} trials stopped early"
        elif run.cancel_requested:
            run.state, run.reason = "cancelled", cancelled_by(run.cancel_requested)
        else:
            failed = [k for k, n in run.nodes.items() if n.state == "failed"]
            run.state = "failed"
            run.reason = f"node {failed[0]} failed: {run.nodes[failed[0]].reason}" if failed else "not every node ran"
            if run.sweep and failed:
                done = sum(s in ("succeeded", "reused") for s in states)
                params = params_label(run.sweep["parameters"].get(failed[0], {}))
                run.reason = (
                    f"{done} of {len(states)} trials succeeded; {failed[0]} ({params}) failed: "
                    f"{run.nodes[failed[0]].reason}"
                )

    def _set_node(self, run_id: str, node_id: str, **changes: Any) -> PipelineRun:
        def apply(run: PipelineRun) -> None:
            node = run.nodes[node_id]
            for name, value in changes.items():
                setattr(node, name, value)
            if changes.get("state") in NODE_DONE:
                node.ended = utcnow()

        run = self.store.change(run_id, apply)
        self._emit(run)
        return run

    def node_spec(self, pipeline: Pipeline, node: Node, *, to_run: bool = False) -> tuple[JobSpec, float | None]:
        """A built-in step's job: its settings, with what the nodes it needs bring back added to ``send``.

        ``to_run``: a node naming no machine gets the one a job naming none runs on (``with_machine``: the
        organization's default, where a hub has one); checking a document asks no organization."""
        settings = dict(with_machine(node.settings) if to_run else node.settings)
        brought = [out for up in pipeline.upstream(node.id) for out in declared_outputs(pipeline.node(up))]
        if brought:
            own = list(settings.get("send") or [])
            settings["send"] = own + [b for b in brought if b not in own]
        if node.step == NOTEBOOK_STEP:
            return notebook_spec(settings)
        return parse_settings(settings)

    def _run_node(self, run_id: str, pipeline: Pipeline, node: Node, stop: threading.Event, user: str | None) -> None:
        self._set_node(run_id, node.id, state="running", reason=None, started=utcnow())
        try:
            if node.step in BUILT_IN_STEPS:
                spec, wait_for = self.node_spec(pipeline, node, to_run=True)
                reused = False

                def heard(job: Job, attached: bool) -> None:
                    nonlocal reused
                    reused = job.state == "succeeded"
                    run = self._set_node(run_id, node.id, job_id=job.id)
                    if run.sweep and run.sweep.get("metric"):
                        self.service.ctx.metrics.watch(job.id)  # from its first poll: a short trial's points too

                result = run_spec(self.service, spec, wait_for, on_job=heard, stop=stop, user=user)
                state = "reused" if reused else "succeeded"
                reason = f"unchanged since job {result.job_id} succeeded: its outputs are reused" if reused else None
                if not reused and result.attached:
                    reason = f"attached to job {result.job_id}, which was already doing this work"
                self._set_node(
                    run_id, node.id, state=state, reason=reason, outputs=result.outputs, job_id=result.job_id
                )
            else:
                result = self._run_foreign(run_id, node)
                self._set_node(
                    run_id, node.id, state="succeeded", outputs=result.get("outputs", {}), job_id=result.get("job_id")
                )
        except NotTrained as e:
            if stop.is_set():
                job = self._stop_job(e.job_id, run_id)
                reason = f"the run was cancelled; job {e.job_id} {job.state}" if job else "the run was cancelled"
                self._set_node(run_id, node.id, state="cancelled", reason=reason, job_id=e.job_id)
            else:
                state = "cancelled" if e.state == "cancelled" else "failed"
                reason = e.reason or e.message
                stopped = ((self.store.get(run_id).sweep or {}).get("stopped") or {}).get(node.id)
                if stopped and e.state == "cancelled":  # by its sweep's early stopping (_judge)
                    state, reason = "stopped_early", stopped
                self._set_node(run_id, node.id, state=state, reason=reason, job_id=e.job_id)
        except RemoteComputeError as e:
            self._set_node(run_id, node.id, state="failed", reason=e.message)
        except Exception as e:  # a step's bug ends that node, not the run's other branches
            log.exception("pipeline %s: node %s", run_id, node.id)
            self._set_node(run_id, node.id, state="failed", reason=f"unexpected error: {type(e).__name__}: {e}")

    def _stop_job(self, job_id: str, run_id: str) -> Job | None:
        """A cancelled run's job: cancelled if nobody asked yet, and followed to its end (nobody else
        may be driving it: the CLI has no poller)."""
        job = self.service.get(job_id)
        if job.active and not job.cancel_requested:
            with contextlib.suppress(Conflict):
                run = self.store.get(run_id)
                self.service.cancel(job_id, by=run.cancel_requested or "user")
        return self.service.wait(job_id, timeout=STOP_WAIT)

    def _run_foreign(self, run_id: str, node: Node) -> dict[str, Any]:
        """Another package's step: its executor, called as the entry point describes."""
        from pkgutil import resolve_name

        step = known_steps()[node.step]
        executor = resolve_name(step["executor"])
        result = executor(dict(node.settings), StepContext(os.fspath(self.workspace.root), run_id=run_id))
        return result.to_json() if hasattr(result, "to_json") else dict(result or {})
