/**
 * The main-area widgets commands open: one per machine form, the job form, and one job tab, re-opened
 * not duplicated.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Widget } from '@lumino/widgets';

import { IJobSpec } from '../api';
import { JobDetailWidget } from '../components/JobDetail';
import { JobFormWidget } from '../components/JobForm';
import { MachineFormWidget } from '../components/MachineForm';
import { ICommandContext } from './context';

/**
 * Main-area widgets by id, so a command re-opens rather than duplicates them.
 */
export function reuse<T extends Widget>(
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

export function jobWidgetId(jobId: string): string {
  return `jp-remote-compute-job-${safeId(jobId)}`;
}

export class Openers {
  constructor(private readonly context: ICommandContext) {}

  machineForm(
    mode: 'add' | 'edit',
    source?: string,
    organization = false
  ): MachineFormWidget {
    const { app, model, trans } = this.context;
    const machine = source ? model.machine(source) : undefined;
    const which = organization ? 'org-machine' : 'machine';
    const id =
      mode === 'edit' && source
        ? `jp-remote-compute-edit-${organization ? 'org-' : ''}${safeId(source)}`
        : `jp-remote-compute-add-${which}`;
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
          commands: app.commands,
          mode,
          organization,
          machine: machine
            ? mode === 'add'
              ? { ...machine, name: `${machine.name}-copy`, created: null }
              : machine
            : undefined
        })
    );
  }

  /**
   * The New Job form: filled in with `spec` ("Run Again", "Run on a Machine…"), else empty; one
   * still being filled in is brought back as it is, one a job was started from is started again.
   */
  jobForm(spec?: IJobSpec): JobFormWidget {
    const { app, model, trans, pickFiles } = this.context;
    const id = 'jp-remote-compute-new-job';
    const existing = [...app.shell.widgets('main')].find(w => w.id === id);
    if (
      existing &&
      (spec || (existing instanceof JobFormWidget && existing.started))
    ) {
      existing.dispose();
    }
    return reuse(
      app,
      id,
      () =>
        new JobFormWidget({
          model,
          trans,
          commands: app.commands,
          spec,
          pickFiles
        })
    );
  }

  /**
   * A job's detail, in the one job tab: opening another job replaces the job shown there (eleven
   * jobs looked at are not eleven tabs); a job already shown is brought to the front.
   */
  job(id: string): JobDetailWidget {
    const { app, model, trans } = this.context;
    const shown = [...app.shell.widgets('main')].find(
      (w): w is JobDetailWidget => w instanceof JobDetailWidget
    );
    if (shown && shown.id !== jobWidgetId(id)) {
      const widget = new JobDetailWidget({
        model,
        trans,
        commands: app.commands,
        jobId: id
      });
      widget.id = jobWidgetId(id);
      app.shell.add(widget, 'main', { ref: shown.id, mode: 'tab-after' });
      shown.dispose();
      app.shell.activateById(widget.id);
      return widget;
    }
    return reuse(
      app,
      jobWidgetId(id),
      () =>
        new JobDetailWidget({ model, trans, commands: app.commands, jobId: id })
    );
  }
}
