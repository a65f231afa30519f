/**
 * The jobs' commands: run (a form, a file, again), show, follow the log, cancel, delete, outputs, prune.
 */
import { Notification } from '@jupyterlab/apputils';
import {
  clearIcon,
  deleteIcon,
  runIcon,
  stopIcon
} from '@jupyterlab/ui-components';

import {
  ACTIVE_STATES,
  cancelJob,
  deleteJob,
  IJob,
  IJobSpec,
  isActive,
  isTerminal,
  listJobs,
  pruneJobs
} from '../api';
import {
  askPruneAge,
  confirmCancelJob,
  confirmDeleteJob,
  pickJob,
  showError
} from '../dialogs';
import { computeIcon } from '../icons';
import { CommandIDs, ICommandContext, stringArg } from './context';
import { jobWidgetId, Openers } from './openers';

export function registerJobCommands(
  context: ICommandContext,
  openers: Openers
): void {
  const { app, model, trans } = context;
  const { commands } = app;

  commands.addCommand(CommandIDs.run, {
    // One name in the panel, the palette and the form's own title.
    label: trans.__('New Job'),
    caption: trans.__('Start a job on one of the machines'),
    icon: args => (args.isToolbar ? runIcon : undefined),
    execute: args => {
      void model.refresh().catch(() => undefined);
      const spec = args.spec as unknown as IJobSpec | undefined;
      openers.jobForm(spec && typeof spec === 'object' ? spec : undefined);
    }
  });

  commands.addCommand(CommandIDs.runFile, {
    label: trans.__('Run on a Machine…'),
    caption: trans.__('Run this Python file as a job on one of the machines'),
    icon: computeIcon,
    isVisible: () => {
      const path = context.selectedFile?.() ?? null;
      return !!path && path.endsWith('.py');
    },
    execute: () => {
      const path = context.selectedFile?.() ?? null;
      if (!path) {
        return;
      }
      void model.refresh().catch(() => undefined);
      const quoted = /[\s'"$`\\]/.test(path)
        ? `'${path.replace(/'/g, "'\\''")}'`
        : path;
      openers.jobForm({ command: `python ${quoted}`, send: [path] });
    }
  });

  commands.addCommand(CommandIDs.runAgain, {
    label: trans.__('Run Again'),
    caption: trans.__('Open the New Job form filled in with this job'),
    icon: runIcon,
    execute: async args => {
      const id = stringArg(args, 'id');
      const job = model.job(id) ?? (await model.reloadJob(id));
      const spec: IJobSpec = {
        ...(job.spec ?? { command: job.name }),
        machine: job.machine
      };
      delete spec.key;
      delete spec.new;
      openers.jobForm(spec);
    }
  });

  commands.addCommand(CommandIDs.showJob, {
    label: args =>
      args.id
        ? trans.__('Show Job %1', stringArg(args, 'id'))
        : trans.__('Show Job'),
    execute: args => {
      openers.job(stringArg(args, 'id'));
    }
  });

  commands.addCommand(CommandIDs.showLog, {
    label: trans.__('Show Job Log…'),
    caption: trans.__('Pick a job and follow its log'),
    execute: async args => {
      let id: string | null = stringArg(args, 'id');
      if (!id) {
        await model.refresh().catch(() => undefined);
        id = await pickJob(model.jobs, trans.__('Show Job Log'), trans);
      }
      if (id) {
        openers.job(id);
      }
    }
  });

  commands.addCommand(CommandIDs.cancelJob, {
    label: args => (args.id ? trans.__('Cancel Job') : trans.__('Cancel Job…')),
    caption: trans.__('Stop a queued or running job'),
    icon: args => (args.id ? stopIcon : undefined),
    isEnabled: args => {
      const id = stringArg(args, 'id');
      const job = id ? model.job(id) : undefined;
      return !id || !job || isActive(job.state);
    },
    execute: async args => {
      let id: string | null = stringArg(args, 'id');
      if (!id) {
        // Asked of the server: the panel's list may be filtered or not paged that far.
        let active: readonly IJob[] = [];
        try {
          active = (await listJobs({ state: [...ACTIVE_STATES], limit: 500 }))
            .jobs;
        } catch (error) {
          showError(trans.__('Could not list the active jobs'), error, trans);
          return;
        }
        id = await pickJob(active, trans.__('Cancel Job'), trans);
        if (!id) {
          return;
        }
      }
      const job = model.job(id);
      if (!(await confirmCancelJob(job?.name || id, job?.machine, trans))) {
        return;
      }
      try {
        model.upsertJob(await cancelJob(id));
      } catch (error) {
        showError(trans.__('Could not cancel the job'), error, trans);
      }
    }
  });

  commands.addCommand(CommandIDs.deleteJob, {
    label: trans.__('Delete Job'),
    caption: trans.__('Delete a finished job and its scratch data'),
    icon: deleteIcon,
    isEnabled: args => {
      const job = model.job(stringArg(args, 'id'));
      return !!job && isTerminal(job.state);
    },
    execute: async args => {
      const id = stringArg(args, 'id');
      const job = model.job(id);
      if (!(await confirmDeleteJob(job?.name || id, trans))) {
        return;
      }
      try {
        await deleteJob(id);
        model.removeJob(id);
        for (const widget of app.shell.widgets('main')) {
          if (widget.id === jobWidgetId(id)) {
            widget.close();
          }
        }
      } catch (error) {
        showError(trans.__('Could not delete the job'), error, trans);
      }
    }
  });

  commands.addCommand(CommandIDs.openOutputs, {
    label: trans.__('Open Outputs'),
    caption: trans.__("Open the job's outputs in JupyterLab"),
    execute: async args => {
      const id = stringArg(args, 'id');
      const job = model.job(id) ?? (await model.reloadJob(id));
      const paths = Object.keys(job.outputs ?? {});
      if (paths.length === 0 || paths.length > 5) {
        openers.job(id);
        return;
      }
      for (const path of paths) {
        await commands.execute('docmanager:open', { path });
      }
    }
  });

  commands.addCommand(CommandIDs.pruneJobs, {
    label: trans.__('Forget Old Finished Jobs…'),
    caption: trans.__(
      'Remove finished jobs older than an age from the list and their folders on the machines; MLflow runs stay'
    ),
    icon: args => (args.isToolbar ? clearIcon : undefined),
    execute: async () => {
      const age = await askPruneAge(trans);
      if (!age) {
        return;
      }
      try {
        const result = await pruneJobs(age);
        const left = Object.keys(result.left_on_machines);
        Notification.success(
          left.length
            ? trans.__(
                'Forgot %1 finished jobs; their folders on %2 were left (not reachable).',
                result.count,
                left.join(', ')
              )
            : trans.__('Forgot %1 finished jobs.', result.count),
          { autoClose: 5000 }
        );
        for (const id of result.removed) {
          model.removeJob(id);
        }
        await model.refresh().catch(() => undefined);
      } catch (error) {
        showError(trans.__('Could not forget old jobs'), error, trans);
      }
    }
  });
}
