/**
 * Commands of the extension: the panel, the palette, menus and shortcuts share them.
 *
 * Each area registers its own (machines.ts, jobs.ts; a kind's own through its faces, kindFaces.ts); what they
 * ask a person is in dialogs.ts, the widgets they open in openers.ts.
 */
import { refreshIcon } from '@jupyterlab/ui-components';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';

import { getPipelineRun } from '../api';
import { UsageWidget } from '../components/UsageView';
import { showError } from '../dialogs';
import { computeIcon } from '../icons';
import { kindFaces } from '../kindFaces';
import { openMlflow } from '../mlflow';
import { CommandIDs, ICommandContext, stringArg } from './context';
import { registerJobCommands } from './jobs';
import { registerMachineCommands } from './machines';
import { Openers, reuse } from './openers';

export { CommandIDs } from './context';
export type { ICommandContext } from './context';

export function registerCommands(context: ICommandContext): void {
  const { app, model, panel, trans, palette } = context;
  const { commands } = app;
  kindFaces.registerCommands(commands, model, trans);
  const category = trans.__('Compute');
  const openers = new Openers(context);

  commands.addCommand(CommandIDs.open, {
    label: trans.__('Open Compute Panel'),
    caption: trans.__('Show machines and jobs in the left sidebar'),
    icon: computeIcon,
    execute: () => {
      app.shell.activateById(panel.id);
    }
  });

  commands.addCommand(CommandIDs.refresh, {
    label: trans.__('Refresh Machines and Jobs'),
    icon: refreshIcon,
    execute: () => model.refresh()
  });

  registerMachineCommands(context, openers);
  registerJobCommands(context, openers);

  // A job's id: given, or the job row a context menu was opened on.
  const jobIdOf = (args: ReadonlyPartialJSONObject): string =>
    stringArg(args, 'id') ||
    (app.contextMenuHitTest(node => !!node.dataset.jobId)?.dataset.jobId ?? '');

  commands.addCommand(CommandIDs.openMlflow, {
    label: args =>
      jobIdOf(args) || args.runId
        ? trans.__('Open in MLflow')
        : trans.__('Open MLflow'),
    caption: trans.__(
      "MLflow's own UI in a tab: the job's run, or the list of experiments"
    ),
    isEnabled: args => {
      const id = jobIdOf(args);
      return (
        !id || !!stringArg(args, 'runId') || !!model.job(id)?.mlflow_run_id
      );
    },
    execute: async args => {
      // A job's id (the panel), or a run id and a label (the result of %remote_train), or a
      // sweep's trials' runs to compare (compareRunIds, and its pipelineRunId for their experiment).
      const compare = (args.compareRunIds as string[] | undefined) ?? [];
      const id = compare.length ? '' : jobIdOf(args);
      let job = id ? model.job(id) : undefined;
      try {
        if (compare.length) {
          const run = await getPipelineRun(stringArg(args, 'pipelineRunId'));
          await openMlflow(app, trans, {
            compareRunIds: compare,
            experimentId: run.mlflow_experiment_id ?? undefined,
            label: stringArg(args, 'label'),
            configuredUrl: model.settings.mlflowUiUrl
          });
          return;
        }
        if (id && !job?.mlflow_run_id) {
          job = await model.reloadJob(id);
        }
        const runId = stringArg(args, 'runId') || job?.mlflow_run_id;
        await openMlflow(app, trans, {
          runId: runId || undefined,
          label: stringArg(args, 'label') || job?.name || job?.id,
          configuredUrl: model.settings.mlflowUiUrl,
          // A run recorded on the organization's tracking server is opened there.
          trackingServer: runId
            ? stringArg(args, 'trackingUri') || job?.tracking_uri || undefined
            : undefined
        });
      } catch (error) {
        showError(trans.__('Could not open MLflow'), error, trans);
      }
    }
  });
  app.contextMenu.addItem({
    command: CommandIDs.openMlflow,
    selector: '.jp-RemoteCompute-job',
    rank: 10
  });

  commands.addCommand(CommandIDs.showUsage, {
    label: trans.__('Show Compute Usage'),
    caption: trans.__(
      'Job-hours, GPU-hours, queue time, bytes moved and cost estimates per machine and month'
    ),
    execute: () => {
      reuse(app, 'jp-remote-compute-usage', () => new UsageWidget({ trans }));
    }
  });

  commands.addCommand(CommandIDs.showOrgUsage, {
    label: trans.__("Show the Organization's Usage per User"),
    caption: trans.__(
      "Every user's job-hours and GPU-hours on the organization's machines, per month"
    ),
    isEnabled: () => model.isOrgAdmin,
    execute: () => {
      reuse(
        app,
        'jp-remote-compute-org-usage',
        () => new UsageWidget({ trans, organization: true })
      );
    }
  });

  if (palette) {
    for (const command of [
      CommandIDs.open,
      CommandIDs.addMachine,
      CommandIDs.run,
      CommandIDs.showLog,
      CommandIDs.cancelJob,
      CommandIDs.pruneJobs,
      CommandIDs.showUsage,
      CommandIDs.openMlflow,
      CommandIDs.refresh
    ]) {
      palette.addItem({ command, category });
    }
  }
}
