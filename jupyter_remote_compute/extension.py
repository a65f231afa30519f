"""The jupyter_server extension: settings, the job service, the background poller, events."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from tornado.ioloop import IOLoop
from traitlets import Bool, Float, HasTraits, Int, Unicode

from . import secret_sources
from .engines.faces import PeriodicTask, ServerView, all_faces
from .handlers import RemoteComputeContext, TransferPool
from .jobs.job import Job
from .jobs.listing import index_of
from .jobs.service import JobService, ServiceSettings
from .jobs.snapshot import Snapshot
from .machines.registry import MachineRegistry
from .mlflow_ui import MlflowUI
from .pipelines.events import publish_runs
from .pipelines.runner import PipelineRunner
from .recording.tracking import TrackingSettings, tracking_uri
from .routes import server_routes
from .workspace import Workspace

EVENT_SCHEMA = Path(__file__).parent / "events" / "job.yaml"
EVENT_SCHEMA_ID = "https://events.jupyter.org/jupyter_remote_compute/job"
RETENTION_EVERY = 60.0  # seconds between automatic prunes when keep_finished_jobs is set
WATCH_INTERVAL = 0.2  # seconds between looks at the state file for other processes' changes


def _kind_settings() -> dict[str, Any]:
    """Every kind's server settings (config traits), from its faces."""
    traits: dict[str, Any] = {}
    for faces in all_faces().values():
        traits.update(faces.server_settings())
    return traits


#: The kinds' settings as a base class: traitlets reads config traits from the class, so they are
#: declared before RemoteComputeApp is (``--RemoteComputeApp.<name>``, like its own).
KindSettings = type("KindSettings", (HasTraits,), _kind_settings())


class RemoteComputeApp(ExtensionApp, KindSettings):
    name = "jupyter_remote_compute"

    workspace = Unicode(
        "",
        config=True,
        help="The workspace folder. Default: the nearest folder holding .punica/ upward from the server's root dir, "
        "else the root dir itself.",
    )
    poll_interval = Float(2.0, config=True, help="Seconds between polls of unfinished jobs.")
    cancel_grace = Float(10.0, config=True, help="Seconds between SIGTERM and SIGKILL when a job is cancelled.")
    scratch_dir = Unicode(
        "", config=True, help="Where the built-in machine keeps job directories (default: in Jupyter's data dir)."
    )
    mlflow_tracking_uri = Unicode(
        "", config=True, help="MLflow tracking URI. Default: MLFLOW_TRACKING_URI, else <workspace>/mlflow.db."
    )
    mlflow_experiment = Unicode(
        "",
        config=True,
        help="MLflow experiment for job runs whose script names none (passed to the far side as "
        "MLFLOW_EXPERIMENT_NAME). Default: MLFLOW_EXPERIMENT_NAME, else MLflow's default experiment "
        "(set MLFLOW_EXPERIMENT_NAME rather than this to make the CLI, kernels and pipeline runs agree).",
    )
    mlflow_ui_prestart = Bool(
        True,
        config=True,
        help="Start MLflow's UI for the workspace's own store in the background (at a low priority) when the "
        "server starts and the store exists, so Open in MLflow answers at once. False: on first use.",
    )
    artifact_size_cap = Int(
        100 * 1024 * 1024, config=True, help="Outputs larger than this many bytes in total are not copied to MLflow."
    )
    secrets_store = Unicode(
        "",
        config=True,
        help="Where secrets set here are kept: 'keyring' (a platform keyring that encrypts) or 'file' (one private "
        "file, mode 0600, readable by this user). Default: JUPYTER_REMOTE_COMPUTE_SECRETS_STORE, else 'keyring'.",
    )
    secrets_file = Unicode(
        "",
        config=True,
        help="The private secrets file (secrets_store='file'). Default: JUPYTER_REMOTE_COMPUTE_SECRETS_FILE, else "
        "$XDG_CONFIG_HOME/jupyter-remote-compute/secrets.json.",
    )
    secrets_dir = Unicode(
        "",
        config=True,
        help="A folder of read-only secrets the deployment mounts (each file a secret named by its path; no "
        "group or other permissions). Default: JUPYTER_REMOTE_COMPUTE_SECRETS_DIR.",
    )
    keyring_backend = Unicode(
        "",
        config=True,
        help="A keyring backend to use even if it is not a platform keyring known to encrypt, as module.Class. "
        "Default: JUPYTER_REMOTE_COMPUTE_KEYRING_BACKEND.",
    )
    keep_finished_jobs = Int(
        0,
        config=True,
        help="Keep only the newest N finished jobs: older ones are pruned automatically (their folders on "
        "the machines removed when reachable, their MLflow runs kept). 0: keep every job.",
    )
    max_workers = Int(8, config=True, help="Threads for short blocking work: requests, polls, hashing.")
    max_transfers = Int(
        4, config=True, help="Threads for sending jobs, and as many again for collecting them (long transfers)."
    )

    def initialize_settings(self) -> None:
        self._export_secret_settings()
        root = self.serverapp.root_dir
        workspace = Workspace.find(self.workspace or root, fallback=self.workspace or root)
        settings = ServiceSettings(
            poll_interval=self.poll_interval,
            cancel_grace=self.cancel_grace,
            scratch_dir=Path(self.scratch_dir) if self.scratch_dir else None,
            tracking=TrackingSettings(
                tracking_uri=self.mlflow_tracking_uri or None,
                **({"experiment": self.mlflow_experiment} if self.mlflow_experiment else {}),
                artifact_size_cap=self.artifact_size_cap,
            ),
        )
        self.service = JobService(workspace, settings)
        self.executor = ThreadPoolExecutor(self.max_workers, thread_name_prefix="remote-compute")
        # Long transfers get their own pool, so a gigabyte moving never starves polls and requests.
        self.transfers = TransferPool(self.service, self.max_transfers)
        self.context = RemoteComputeContext(self.service, self.executor, self.transfers)
        self.settings["remote_compute"] = self.context
        kind_settings = {name: getattr(self, name) for name in KindSettings.class_trait_names()}
        # A kind's handlers read its settings from tornado's settings.
        self.settings.update({f"remote_compute_{name}": value for name, value in kind_settings.items()})
        # MLflow's UI for the workspace's runs: the tracking server's, or a process started on first use.
        self.mlflow_ui = MlflowUI(
            tracking_uri(workspace.root, settings.tracking),
            self.serverapp.base_url,
            workspace.root,
            workspace.punica_dir / "mlflow-ui.log",
            logger=self.log,
        )
        self.settings["remote_compute_mlflow_ui"] = self.mlflow_ui
        # Pipeline runs block in threads of their own (pipelines/runner.py), never on the IOLoop.
        self.pipelines = PipelineRunner(self.service)
        self.settings["remote_compute_pipelines"] = self.pipelines
        self._server_tasks = self._elyra_tasks(workspace)
        self._server_view = ServerView(workspace.punica_dir, kind_settings, time.time(), self.log)
        self.serverapp.event_logger.register_event_schema(EVENT_SCHEMA)
        self._emitted: dict[str, tuple[str, str, int]] = {}
        self._poller: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._warming: asyncio.Future[None] | None = None
        self._prestart: asyncio.Task[None] | None = None
        # Also scheduled here: a host that never runs the start hook (pytest-jupyter's server)
        # still gets its poller once the loop runs. Starting is idempotent.
        IOLoop.current().add_callback(self._start_poller)
        self.log.info("remote-compute: workspace %s", workspace.root)

    def _elyra_tasks(self, workspace: Workspace) -> list[PeriodicTask]:
        """With Elyra installed: its runtime processor finds the runner, and each machine is a runtime configuration."""
        from .elyra import bind_server, elyra_installed

        if not elyra_installed():
            return []
        from .elyra.runtimes import RuntimeSync

        bind_server(self.pipelines, self.serverapp.base_url)
        sync = RuntimeSync(MachineRegistry(workspace.compute_yaml))
        return [PeriodicTask("keeping the machines as Elyra runtime configurations", sync.run)]

    def _export_secret_settings(self) -> None:
        """Secret settings become this process's environment, so kernels and terminals it starts agree."""
        for value, variable in (
            (self.secrets_store, secret_sources.STORE_ENV),
            (self.secrets_file, secret_sources.FILE_ENV),
            (self.secrets_dir, secret_sources.DIR_ENV),
            (self.keyring_backend, secret_sources.BACKEND_ENV),
        ):
            if value:
                os.environ[variable] = value

    def initialize_handlers(self) -> None:
        kind_routes = [route for faces in all_faces().values() for route in faces.routes()]
        self.handlers.extend(server_routes(kind_routes))

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        self._start_poller()

    def _start_poller(self) -> None:
        if self._poller is not None:
            return
        loop = asyncio.get_running_loop()

        def heard(job: Job) -> None:
            # Changes made by this process's worker threads reach the event bus on the loop's thread.
            with contextlib.suppress(RuntimeError):  # the loop closed: the server is stopping
                loop.call_soon_threadsafe(self._emit, job)

        self.service.add_listener(heard)
        # Long-polled log and metrics reads wake on their job's news.
        self.context.wakeups.bind(loop)
        self.service.ctx.metrics.add_listener(self.context.wakeups.wake_threadsafe)
        self._poller = asyncio.create_task(self._poll_forever())
        self._watcher = asyncio.create_task(self._watch_forever())
        self._warming = loop.run_in_executor(self.executor, self._warm_up)
        if self.mlflow_ui_prestart:
            self._prestart = asyncio.create_task(self.mlflow_ui.prestart())
        publish_runs(self.pipelines, self.serverapp.event_logger, loop)  # before any run is taken up
        loop.run_in_executor(self.executor, self._resume_pipelines)

    def _resume_pipelines(self) -> None:
        try:
            taken = self.pipelines.resume()
            if taken:
                self.log.info("remote-compute: taken up pipeline runs %s", ", ".join(taken))
        except Exception:
            self.log.exception("remote-compute: taking up unfinished pipeline runs failed")

    def _warm_up(self) -> None:
        try:
            self.service.warm_up()
        except Exception:  # only an optimisation: the first submit loads them itself and reports any problem
            self.log.exception("remote-compute: loading the secret detectors and keyring at start failed")

    def _emit(self, job: Job) -> None:
        seen = (job.state, job.updated, job.log_size)
        if self._emitted.get(job.id) == seen:
            return
        self._emitted[job.id] = seen
        self.context.wakeups.wake(job.id)
        self.serverapp.event_logger.emit(
            schema_id=EVENT_SCHEMA_ID,
            data={
                "id": job.id,
                "name": job.name,
                "machine": job.machine,
                "state": job.state,
                "reason": job.reason,
                "updated": job.updated,
                "log_size": job.log_size,
            },
        )

    def _retain(self) -> None:
        result = self.service.prune(keep_newest=self.keep_finished_jobs)
        if result.removed:
            self.log.info(
                "remote-compute: pruned %d finished jobs beyond the newest %d",
                len(result.removed),
                self.keep_finished_jobs,
            )

    def _unannounced(self, snapshot: Snapshot, seen_generation: int) -> list[Job]:
        emitted = self._emitted
        delta = snapshot.changes_since(seen_generation) if seen_generation >= 0 else None
        if delta is not None:
            # Only the jobs changed since the snapshot last looked at (journal replays, commits).
            candidates: Iterable[Job] = (snapshot.held(job_id) for job_id in delta.touched)
        else:
            candidates = snapshot.jobs.values()
        return [j for j in candidates if emitted.get(j.id) != (j.state, j.updated, j.log_size)]

    def _look(self, seen_generation: int) -> tuple[int, list[Job]]:
        """One look at the state file, in a worker thread: its generation now and the jobs to announce.

        The job list's index follows each new snapshot here, so a request finds it patched (at start:
        built) rather than doing it itself; the first look is the server's read of the file at start.
        """
        store = self.service.store
        snapshot = store.snapshot()
        if snapshot.generation == seen_generation:
            return seen_generation, []
        index_of(store).follow(snapshot)
        return snapshot.generation, self._unannounced(snapshot, seen_generation)

    async def _watch_forever(self) -> None:
        """Announce changes other processes (CLI, kernels) make, within a fraction of a second.

        A look costs a stat and a read of the journal's new lines, so it runs far more often than
        the poll of the machines.
        """
        loop = asyncio.get_running_loop()
        seen_generation = -1
        try:
            # Compacted at start, once: other processes' journal lines are folded in while few are reading.
            await loop.run_in_executor(self.executor, self.service.store.compact)
        except Exception:
            # Only an optimisation: a lock held too long or a file of a newer version must not end the watch.
            self.log.exception("remote-compute: compacting the job state file at start failed")
        while True:
            try:
                generation, changed = await loop.run_in_executor(self.executor, self._look, seen_generation)
                if seen_generation == -1:
                    # At start every job is news: remember them rather than flood the event bus.
                    self._emitted.update({j.id: (j.state, j.updated, j.log_size) for j in changed})
                else:
                    for job in changed:
                        self._emit(job)
                seen_generation = generation
            except asyncio.CancelledError:
                raise
            except Exception:
                self.log.exception("remote-compute: reading the job state file failed")
            await asyncio.sleep(WATCH_INTERVAL)

    async def _poll_forever(self) -> None:
        """Reconcile at start, then drive every unfinished job, including ones other processes submitted."""
        loop = asyncio.get_running_loop()
        reconciled = False
        next_retention = 0.0
        periodic = [*(task for faces in all_faces().values() for task in faces.periodic), *self._server_tasks]
        while True:
            for task in periodic:
                try:
                    await loop.run_in_executor(self.executor, task.run, self._server_view)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # One kind's damaged files must not stop every other machine's jobs from being driven.
                    self.log.exception("remote-compute: %s failed", task.what)
            try:
                await loop.run_in_executor(self.executor, self.service.poll_active, self.transfers.advance)
                snapshot = await loop.run_in_executor(self.executor, self.service.store.snapshot)
                if self.keep_finished_jobs > 0 and loop.time() >= next_retention:
                    next_retention = loop.time() + RETENTION_EVERY
                    await loop.run_in_executor(self.executor, self._retain)
                if not reconciled:
                    # Said once: whoever restarts a server (an operator, a test) knows when it caught up.
                    self.log.info("remote-compute: reconciled %d jobs after start", len(snapshot.jobs))
                    reconciled = True
            except asyncio.CancelledError:
                raise
            except Exception:
                self.log.exception("remote-compute: polling jobs failed")
            await asyncio.sleep(self.poll_interval)

    async def stop_extension(self) -> None:
        if self._prestart is not None:
            self._prestart.cancel()  # a UI still starting is stopped by its own start
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._prestart
        await self.mlflow_ui.stop()
        if self._poller is not None:
            self._poller.cancel()
        if self._watcher is not None:
            self._watcher.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.transfers.shutdown()
        self.pipelines.close()
        self.service.close()
