"""``/remote-compute/pipelines/…``: check a document; start a run or a sweep; list, read and cancel runs
(thin, as handlers.py)."""

from __future__ import annotations

from ..errors import InvalidSettings
from ..handlers import PREFIX, RemoteComputeHandler, api
from ..schema.pipeline import run_started, sweep_started
from .runner import PipelineRunner
from .sweep import plan_from_json

RUN_ID = r"(?P<run_id>[A-Za-z0-9_-]+)"


class PipelineHandler(RemoteComputeHandler):
    @property
    def runner(self) -> PipelineRunner:
        return self.settings["remote_compute_pipelines"]


class PipelineRunsHandler(PipelineHandler):
    @api
    async def get(self) -> None:
        runs = await self.call(self.runner.list_runs)
        self.reply({"runs": [r.public_json() for r in runs]})

    @api(action="execute")
    async def post(self) -> None:
        body = self.body()
        unknown = sorted(set(body) - {"file"})
        if unknown:
            raise InvalidSettings(f"{unknown[0]}: unknown setting; give only file", field=unknown[0])
        run, attached = await self.call(self.runner.start, body.get("file"), user=self.person())
        self.reply(run_started(run, attached), 200 if attached else 201)


class PipelineSweepsHandler(PipelineHandler):
    @api(action="execute")
    async def post(self) -> None:
        """A sweep: its trials checked and drawn (``sweep.plan_from_json``), then driven by the server."""
        plan = await self.call(plan_from_json, self.body())
        run, attached = await self.call(self.runner.start_sweep, plan, background=True, user=self.person())
        self.reply(sweep_started(run, attached, list(plan.warnings)), 200 if attached else 201)


class PipelineValidateHandler(PipelineHandler):
    # It runs nothing and writes nothing: reading the workspace is all it needs.
    @api(action="read")
    async def post(self) -> None:
        """What a canvas shows before a run: the problems of a document as drawn, saved or not."""
        body = self.body()
        unknown = sorted(set(body) - {"file", "document"})
        if unknown:
            raise InvalidSettings(f"{unknown[0]}: unknown setting; give file and document", field=unknown[0])
        if "document" not in body:
            raise InvalidSettings("document: give the pipeline document to check", field="document")
        problems = await self.call(self.runner.check_document, body.get("file"), body["document"])
        self.reply({"problems": [p.to_json() for p in problems]})


class PipelineRunHandler(PipelineHandler):
    @api
    async def get(self, run_id: str) -> None:
        run = await self.call(self.runner.get, run_id)
        self.reply(run.public_json())


class PipelineRunCancelHandler(PipelineHandler):
    @api(action="execute")
    async def post(self, run_id: str) -> None:
        run = await self.call(self.runner.cancel, run_id, by=self.person_shown())
        self.reply(run.public_json())


#: Part of the API (openapi.yaml); ``routes.py`` registers them.
PIPELINE_HANDLERS: list[tuple[str, type[RemoteComputeHandler]]] = [
    (rf"{PREFIX}/pipelines/runs", PipelineRunsHandler),
    (rf"{PREFIX}/pipelines/sweeps", PipelineSweepsHandler),
    (rf"{PREFIX}/pipelines/validate", PipelineValidateHandler),
    (rf"{PREFIX}/pipelines/runs/{RUN_ID}", PipelineRunHandler),
    (rf"{PREFIX}/pipelines/runs/{RUN_ID}/cancel", PipelineRunCancelHandler),
]
