/**
 * Commands of the extension: the panel, the palette, menus and shortcuts share them.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  InputDialog,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';
import {
  addIcon,
  clearIcon,
  copyIcon,
  deleteIcon,
  editIcon,
  refreshIcon,
  runIcon,
  stopIcon
} from '@jupyterlab/ui-components';
import {
  ReadonlyJSONValue,
  ReadonlyPartialJSONObject
} from '@lumino/coreutils';
import { Widget } from '@lumino/widgets';

import {
  ACTIVE_STATES,
  cancelJob,
  deleteJob,
  IJob,
  IJobSpec,
  isActive,
  isTerminal,
  listJobs,
  pruneJobs,
  removeMachine,
  trustMachine,
  updateMachine
} from './api';
import { registerAgentCommands } from './agent';
import { ComputePanel } from './components/ComputePanel';
import { JobDetailWidget } from './components/JobDetail';
import { JobFormWidget } from './components/JobForm';
import { MachineFormWidget } from './components/MachineForm';
import { UsageWidget } from './components/UsageView';
import { formatSize } from './format';
import { openMlflow } from './mlflow';
import { computeIcon } from './icons';
import { asAPIError, ComputeModel } from './model';

export namespace CommandIDs {
  export const open = 'remote-compute:open';
  export const refresh = 'remote-compute:refresh';
  export const addMachine = 'remote-compute:add-machine';
  export const editMachine = 'remote-compute:edit-machine';
  export const duplicateMachine = 'remote-compute:duplicate-machine';
  export const removeMachine = 'remote-compute:remove-machine';
  export const checkMachine = 'remote-compute:check-machine';
  export const enableMachine = 'remote-compute:enable-machine';
  export const run = 'remote-compute:run';
  export const runFile = 'remote-compute:run-file';
  export const runAgain = 'remote-compute:run-again';
  export const showJob = 'remote-compute:show-job';
  export const showLog = 'remote-compute:show-log';
  export const cancelJob = 'remote-compute:cancel-job';
  export const deleteJob = 'remote-compute:delete-job';
  export const openOutputs = 'remote-compute:open-outputs';
  export const pruneJobs = 'remote-compute:prune-jobs';
  export const showUsage = 'remote-compute:show-usage';
  export const openMlflow = 'remote-compute:open-mlflow';
}

/**
 * What the commands act on.
 */
export interface ICommandContext {
  app: JupyterFrontEnd;
  model: ComputeModel;
  panel: ComputePanel;
  trans: TranslationBundle;
  palette: ICommandPalette | null;
  /**
   * The path of the file selected in the file browser, if any (for "Run on a machine…").
   */
  selectedFile?: () => string | null;
}

function stringArg(args: ReadonlyPartialJSONObject, key: string): string {
  const value = args[key];
  return typeof value === 'string' ? value : '';
}

/**
 * The facts every kind of machine reports (engines/base.py `Facts`), in the order shown.
 */
const COMMON_FACTS = [
  'os',
  'kernel',
  'python',
  'cpus',
  'memory_bytes',
  'gpus',
  'disk_free_bytes',
  'rtt_ms'
];

interface IGpuFact {
  name?: string;
  memory_bytes?: number | null;
}

function formatGpus(gpus: unknown): string {
  if (!Array.isArray(gpus) || gpus.length === 0) {
    return 'no GPU';
  }
  const counts = new Map<string, number>();
  for (const gpu of gpus as IGpuFact[]) {
    const label = gpu.memory_bytes
      ? `${gpu.name ?? 'GPU'} (${formatSize(gpu.memory_bytes)})`
      : (gpu.name ?? 'GPU');
    counts.set(label, (counts.get(label) ?? 0) + 1);
  }
  return [...counts.entries()]
    .map(([label, n]) => (n > 1 ? `${n}× ${label}` : label))
    .join(', ');
}

function formatFact(key: string, value: unknown): string {
  switch (key) {
    case 'os':
    case 'kernel':
      return String(value);
    case 'python':
      return `Python ${String(value)}`;
    case 'cpus':
      return `${String(value)} CPUs`;
    case 'memory_bytes':
      return `${formatSize(value as number)} memory`;
    case 'gpus':
      return formatGpus(value);
    case 'disk_free_bytes':
      return `${formatSize(value as number)} free disk`;
    case 'rtt_ms':
      return `${Math.round(value as number)} ms round trip`;
  }
  if (key.endsWith('_bytes') && typeof value === 'number') {
    return `${key.slice(0, -6).replace(/_/g, ' ')}: ${formatSize(value)}`;
  }
  const text =
    typeof value === 'object' ? JSON.stringify(value) : String(value);
  return `${key.replace(/_/g, ' ')}: ${text}`;
}

/**
 * A short, human line of a machine's facts (`Ubuntu 24.04 · Python 3.11.7 · 8 CPUs · no GPU · …`).
 *
 * Every common fact is shown for every kind (GPUs and free disk included), then what only
 * that kind reports (a server's version, its transfer route).
 */
export function formatFacts(facts: Record<string, unknown>): string {
  const present = (v: unknown): boolean =>
    v !== null &&
    v !== undefined &&
    v !== '' &&
    !(Array.isArray(v) && v.length === 0);
  const common = COMMON_FACTS.filter(
    k => k in facts && (k === 'gpus' || present(facts[k]))
  ).map(k => formatFact(k, facts[k]));
  const extras = Object.entries(facts)
    .filter(([k, v]) => !COMMON_FACTS.includes(k) && present(v))
    .map(([k, v]) => formatFact(k, v));
  return [...common, ...extras].join(' · ');
}

function jobLabel(job: IJob): string {
  return `${job.name || job.id} — ${job.machine} — ${job.state} (${job.id})`;
}

/**
 * Ask the user to pick a job from a list; resolves to its id or null.
 */
async function pickJob(
  jobs: readonly IJob[],
  title: string,
  trans: TranslationBundle
): Promise<string | null> {
  if (jobs.length === 0) {
    await showDialog({
      title,
      body: trans.__('There is no job to choose from.'),
      buttons: [Dialog.okButton({ label: trans.__('OK') })]
    });
    return null;
  }
  const shown = jobs.slice(0, 500);
  const labels = shown.map(jobLabel);
  const result = await InputDialog.getItem({
    title,
    label: trans.__('Job'),
    items: labels,
    current: 0,
    okLabel: trans.__('Choose'),
    cancelLabel: trans.__('Cancel')
  });
  if (!result.button.accept || result.value === null) {
    return null;
  }
  const index = labels.indexOf(result.value);
  return index >= 0 ? shown[index].id : null;
}

function showError(
  title: string,
  error: unknown,
  trans: TranslationBundle
): void {
  const apiError = asAPIError(error);
  void showDialog({
    title,
    body: apiError.message,
    buttons: [Dialog.okButton({ label: trans.__('OK') })]
  });
}

/**
 * Main-area widgets by id, so a command re-opens rather than duplicates them.
 */
function reuse<T extends Widget>(
  app: JupyterFrontEnd,
  id: string,
  create: () => T
): T {
  for (const widget of app.shell.widgets('main')) {
    if (widget.id === id) {
      app.shell.activateById(id);
      return widget as T;
    }
  }
  const widget = create();
  widget.id = id;
  app.shell.add(widget, 'main');
  app.shell.activateById(id);
  return widget;
}

function safeId(text: string): string {
  return text.replace(/[^A-Za-z0-9_-]/g, '_');
}

export function registerCommands(context: ICommandContext): void {
  const { app, model, panel, trans, palette } = context;
  const { commands } = app;
  registerAgentCommands(commands, model, trans);
  const category = trans.__('Compute');

  const openMachineForm = (
    mode: 'add' | 'edit',
    source?: string
  ): MachineFormWidget => {
    const machine = source ? model.machine(source) : undefined;
    const id =
      mode === 'edit' && source
        ? `jp-remote-compute-edit-${safeId(source)}`
        : 'jp-remote-compute-add-machine';
    const existing = [...app.shell.widgets('main')].find(w => w.id === id);
    if (existing && mode === 'add' && source) {
      // "Duplicate" over an open Add form: start again from the new source.
      existing.dispose();
    }
    return reuse(
      app,
      id,
      () =>
        new MachineFormWidget({
          model,
          trans,
          commands,
          mode,
          machine: machine
            ? mode === 'add'
              ? { ...machine, name: `${machine.name}-copy`, created: null }
              : machine
            : undefined
        })
    );
  };

  const openJobForm = (spec?: IJobSpec, envNote?: boolean): JobFormWidget => {
    const id = 'jp-remote-compute-new-job';
    const existing = [...app.shell.widgets('main')].find(w => w.id === id);
    if (existing && spec) {
      existing.dispose();
    }
    return reuse(
      app,
      id,
      () =>
        new JobFormWidget({ model, trans, commands, spec, keptEnv: envNote })
    );
  };

  const openJob = (id: string): JobDetailWidget =>
    reuse(
      app,
      `jp-remote-compute-job-${safeId(id)}`,
      () => new JobDetailWidget({ model, trans, commands, jobId: id })
    );

  commands.addCommand(CommandIDs.open, {
    label: trans.__('Open Compute panel'),
    caption: trans.__('Show machines and jobs in the left sidebar'),
    icon: computeIcon,
    execute: () => {
      app.shell.activateById(panel.id);
    }
  });

  commands.addCommand(CommandIDs.refresh, {
    label: trans.__('Refresh machines and jobs'),
    icon: refreshIcon,
    execute: () => model.refresh()
  });

  commands.addCommand(CommandIDs.addMachine, {
    label: trans.__('Add a machine'),
    caption: trans.__('Add an SSH host or a Jupyter Server to run jobs on'),
    icon: args => (args.isToolbar ? addIcon : undefined),
    execute: () => {
      void model.refresh().catch(() => undefined);
      openMachineForm('add');
    }
  });

  commands.addCommand(CommandIDs.editMachine, {
    label: args =>
      args.name
        ? trans.__('Edit machine %1', stringArg(args, 'name'))
        : trans.__('Edit machine'),
    icon: editIcon,
    isEnabled: args => {
      const machine = model.machine(stringArg(args, 'name'));
      return !!machine && !machine.builtin;
    },
    execute: args => {
      openMachineForm('edit', stringArg(args, 'name'));
    }
  });

  commands.addCommand(CommandIDs.duplicateMachine, {
    label: args =>
      args.name
        ? trans.__('Duplicate machine %1', stringArg(args, 'name'))
        : trans.__('Duplicate machine'),
    icon: copyIcon,
    isEnabled: args => {
      const machine = model.machine(stringArg(args, 'name'));
      return !!machine && !machine.builtin;
    },
    execute: args => {
      openMachineForm('add', stringArg(args, 'name'));
    }
  });

  commands.addCommand(CommandIDs.removeMachine, {
    label: args =>
      args.name
        ? trans.__('Remove machine %1', stringArg(args, 'name'))
        : trans.__('Remove machine'),
    icon: deleteIcon,
    isEnabled: args => {
      const machine = model.machine(stringArg(args, 'name'));
      return !!machine && !machine.builtin;
    },
    execute: async args => {
      const name = stringArg(args, 'name');
      const result = await showDialog({
        title: trans.__('Remove machine %1?', name),
        body: trans.__(
          'The machine is removed from compute.yaml. Its jobs and their records stay.'
        ),
        buttons: [
          Dialog.cancelButton({ label: trans.__('Cancel') }),
          Dialog.warnButton({ label: trans.__('Remove') })
        ]
      });
      if (!result.button.accept) {
        return;
      }
      try {
        await removeMachine(name, model.version || undefined);
        model.forgetMachine(name);
      } catch (error) {
        showError(trans.__('Could not remove %1', name), error, trans);
      }
      await model.refresh().catch(() => undefined);
    }
  });

  commands.addCommand(CommandIDs.enableMachine, {
    label: args =>
      args.enabled === false
        ? trans.__('Disable machine %1', stringArg(args, 'name'))
        : trans.__('Enable machine %1', stringArg(args, 'name')),
    isEnabled: args => {
      const machine = model.machine(stringArg(args, 'name'));
      return !!machine && !machine.builtin;
    },
    execute: async args => {
      const name = stringArg(args, 'name');
      const enabled = args.enabled !== false;
      try {
        await updateMachine(name, {
          enabled,
          version: model.version || undefined
        });
      } catch (error) {
        showError(
          enabled
            ? trans.__('Could not enable %1', name)
            : trans.__('Could not disable %1', name),
          error,
          trans
        );
      }
      await model.refresh().catch(() => undefined);
    }
  });

  commands.addCommand(CommandIDs.checkMachine, {
    label: args =>
      args.name
        ? trans.__('Check machine %1', stringArg(args, 'name'))
        : trans.__('Check machine'),
    execute: async args => {
      const name = stringArg(args, 'name');
      const id = Notification.emit(
        trans.__('Checking %1…', name),
        'in-progress',
        { autoClose: false }
      );
      // The answer replaces the "Checking…" notification rather than updating it: an update
      // that arrives before the first toast is on screen is dropped by the toast layer (under
      // load that can take over a second), a dismissal is not.
      const answer = (
        message: string,
        type: Notification.TypeOptions,
        options: Notification.IOptions<ReadonlyJSONValue>
      ): void => {
        Notification.dismiss(id);
        Notification.emit(message, type, options);
      };
      try {
        const result = await model.check(name);
        const facts = formatFacts(result.facts ?? {});
        answer(
          facts
            ? trans.__('%1 answered: %2', name, facts)
            : trans.__('%1 answered.', name),
          'success',
          { autoClose: 8000 }
        );
        return true;
      } catch (error) {
        const apiError = asAPIError(error);
        const hostKey = apiError.details?.can_trust
          ? apiError.details.host_key
          : undefined;
        const trustAction = hostKey
          ? [
              {
                label: trans.__('Trust this host'),
                caption: trans.__(
                  'Compare the fingerprint, then record the key in known_hosts'
                ),
                callback: () => {
                  void showDialog({
                    title: trans.__('Trust the host key of %1?', name),
                    body: trans.__(
                      "The machine presents this %1 key:\n\n%2\n\nTrust it only if it matches the fingerprint the machine's administrator gave you. It will be added to known_hosts.",
                      hostKey.type,
                      hostKey.fingerprint
                    ),
                    buttons: [
                      Dialog.cancelButton({ label: trans.__('Cancel') }),
                      Dialog.warnButton({ label: trans.__('Trust this host') })
                    ]
                  }).then(async result => {
                    if (!result.button.accept) {
                      return;
                    }
                    try {
                      await trustMachine(name, hostKey.fingerprint);
                      await commands.execute(CommandIDs.checkMachine, { name });
                    } catch (trustError) {
                      Notification.error(asAPIError(trustError).message);
                    }
                  });
                }
              }
            ]
          : [];
        answer(
          trans.__('%1 could not be reached: %2', name, apiError.message),
          'error',
          {
            autoClose: false,
            actions: [
              ...trustAction,
              {
                label: trans.__('Details'),
                caption: trans.__('Show the whole answer and edit the machine'),
                callback: () => {
                  void showDialog({
                    title: trans.__('Check of %1 failed', name),
                    body: `${apiError.message}\n\n(${apiError.code}${
                      apiError.field ? `, ${apiError.field}` : ''
                    })`,
                    buttons: [
                      Dialog.cancelButton({ label: trans.__('Close') }),
                      Dialog.okButton({ label: trans.__('Edit machine') })
                    ]
                  }).then(r => {
                    if (
                      r.button.accept &&
                      model.machine(name)?.builtin === false
                    ) {
                      openMachineForm('edit', name);
                    }
                  });
                }
              }
            ]
          }
        );
        return false;
      }
    }
  });

  commands.addCommand(CommandIDs.run, {
    label: args =>
      args.isToolbar ? trans.__('New job') : trans.__('Run on a machine…'),
    caption: trans.__('Start a job on one of the machines'),
    icon: args => (args.isToolbar ? runIcon : undefined),
    execute: args => {
      void model.refresh().catch(() => undefined);
      const spec = args.spec as unknown as IJobSpec | undefined;
      openJobForm(spec && typeof spec === 'object' ? spec : undefined);
    }
  });

  commands.addCommand(CommandIDs.runFile, {
    label: trans.__('Run on a machine…'),
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
      openJobForm({ command: `python ${quoted}`, send: [path] });
    }
  });

  commands.addCommand(CommandIDs.runAgain, {
    label: trans.__('Run again'),
    caption: trans.__('Open the New job form filled in with this job'),
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
      openJobForm(spec, !!spec.env && Object.keys(spec.env).length > 0);
    }
  });

  commands.addCommand(CommandIDs.showJob, {
    label: args =>
      args.id
        ? trans.__('Show job %1', stringArg(args, 'id'))
        : trans.__('Show job'),
    execute: args => {
      openJob(stringArg(args, 'id'));
    }
  });

  commands.addCommand(CommandIDs.showLog, {
    label: trans.__('Show job log…'),
    caption: trans.__('Pick a job and follow its log'),
    execute: async args => {
      let id: string | null = stringArg(args, 'id');
      if (!id) {
        await model.refresh().catch(() => undefined);
        id = await pickJob(model.jobs, trans.__('Show job log'), trans);
      }
      if (id) {
        openJob(id);
      }
    }
  });

  commands.addCommand(CommandIDs.cancelJob, {
    label: args => (args.id ? trans.__('Cancel job') : trans.__('Cancel job…')),
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
          active = (
            await listJobs({ state: [...ACTIVE_STATES].join(','), limit: 500 })
          ).jobs;
        } catch (error) {
          showError(trans.__('Could not list the active jobs'), error, trans);
          return;
        }
        id = await pickJob(active, trans.__('Cancel job'), trans);
        if (!id) {
          return;
        }
      }
      const job = model.job(id);
      const result = await showDialog({
        title: trans.__('Cancel job %1?', job?.name || id),
        body: trans.__(
          'The job is stopped on %1 (TERM, then KILL after a grace period). Outputs are not brought back.',
          job?.machine ?? trans.__('its machine')
        ),
        buttons: [
          Dialog.cancelButton({ label: trans.__('Keep running') }),
          Dialog.warnButton({ label: trans.__('Cancel job') })
        ]
      });
      if (!result.button.accept) {
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
    label: trans.__('Delete job'),
    caption: trans.__('Delete a finished job and its scratch data'),
    icon: deleteIcon,
    isEnabled: args => {
      const job = model.job(stringArg(args, 'id'));
      return !!job && isTerminal(job.state);
    },
    execute: async args => {
      const id = stringArg(args, 'id');
      const job = model.job(id);
      const result = await showDialog({
        title: trans.__('Delete job %1?', job?.name || id),
        body: trans.__(
          'The job record and its scratch data are deleted. Outputs already in the workspace and the MLflow run stay.'
        ),
        buttons: [
          Dialog.cancelButton({ label: trans.__('Cancel') }),
          Dialog.warnButton({ label: trans.__('Delete') })
        ]
      });
      if (!result.button.accept) {
        return;
      }
      try {
        await deleteJob(id);
        model.removeJob(id);
        for (const widget of app.shell.widgets('main')) {
          if (widget.id === `jp-remote-compute-job-${safeId(id)}`) {
            widget.close();
          }
        }
      } catch (error) {
        showError(trans.__('Could not delete the job'), error, trans);
      }
    }
  });

  commands.addCommand(CommandIDs.openOutputs, {
    label: trans.__('Open outputs'),
    caption: trans.__("Open the job's outputs in JupyterLab"),
    execute: async args => {
      const id = stringArg(args, 'id');
      const job = model.job(id) ?? (await model.reloadJob(id));
      const paths = Object.keys(job.outputs ?? {});
      if (paths.length === 0 || paths.length > 5) {
        openJob(id);
        return;
      }
      for (const path of paths) {
        await commands.execute('docmanager:open', { path });
      }
    }
  });

  commands.addCommand(CommandIDs.pruneJobs, {
    label: trans.__('Forget old finished jobs…'),
    caption: trans.__(
      'Remove finished jobs older than an age from the list and their folders on the machines; MLflow runs stay'
    ),
    icon: args => (args.isToolbar ? clearIcon : undefined),
    execute: async () => {
      const asked = await InputDialog.getText({
        title: trans.__('Forget old finished jobs'),
        label: trans.__(
          'Finished more than this long ago (e.g. 90d, 12h). Active jobs and MLflow runs are kept.'
        ),
        text: '90d',
        okLabel: trans.__('Forget'),
        cancelLabel: trans.__('Cancel')
      });
      if (!asked.button.accept || !asked.value) {
        return;
      }
      try {
        const result = await pruneJobs(asked.value.trim());
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
      // A job's id (the panel), or a run id and a label (the result of %remote_train).
      const id = jobIdOf(args);
      let job = id ? model.job(id) : undefined;
      try {
        if (id && !job?.mlflow_run_id) {
          job = await model.reloadJob(id);
        }
        await openMlflow(app, trans, {
          runId: stringArg(args, 'runId') || job?.mlflow_run_id || undefined,
          label: stringArg(args, 'label') || job?.name || job?.id,
          configuredUrl: model.settings.mlflowUiUrl
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
    label: trans.__('Show compute usage'),
    caption: trans.__(
      'Job-hours, GPU-hours, queue time, bytes moved and cost estimates per machine and month'
    ),
    execute: () => {
      reuse(app, 'jp-remote-compute-usage', () => new UsageWidget({ trans }));
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
