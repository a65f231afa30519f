/**
 * The pipeline document in JupyterLab: its file type, its widget factory, "New Pipeline" in the
 * launcher, the File menu and the command palette, and Run / Cancel of the pipeline in front.
 */
import { ILayoutRestorer, JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette, WidgetTracker } from '@jupyterlab/apputils';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { ILauncher } from '@jupyterlab/launcher';
import { IMainMenu } from '@jupyterlab/mainmenu';
import { TranslationBundle } from '@jupyterlab/translation';

import { cancelPipelineRun } from '../api';
import { CommandIDs, stringArg } from '../commands/context';
import { showError } from '../dialogs';
import { IJobEvents } from '../eventsocket';
import { pipelineIcon } from '../icons';
import {
  emptyPipeline,
  PIPELINE_EXTENSION,
  serializePipeline
} from './document';
import {
  PIPELINE_FACTORY,
  PIPELINE_FILE_TYPE,
  PipelineFactory,
  PipelineWidget
} from './widget';
import { nameAndRun } from './run';

export interface IPipelineOptions {
  app: JupyterFrontEnd;
  events: IJobEvents | null;
  trans: TranslationBundle;
  palette: ICommandPalette | null;
  launcher: ILauncher | null;
  mainMenu: IMainMenu | null;
  restorer: ILayoutRestorer | null;
  fileBrowser: IDefaultFileBrowser | null;
}

export function registerPipelines(options: IPipelineOptions): void {
  const { app, trans } = options;
  const { commands, docRegistry } = app;

  docRegistry.addFileType({
    name: PIPELINE_FILE_TYPE,
    displayName: trans.__('Pipeline'),
    extensions: [PIPELINE_EXTENSION],
    mimeTypes: ['application/json'],
    fileFormat: 'text',
    contentType: 'file',
    icon: pipelineIcon
  });
  const factory = new PipelineFactory({
    name: PIPELINE_FACTORY,
    label: trans.__('Pipeline Canvas'),
    fileTypes: [PIPELINE_FILE_TYPE],
    defaultFor: [PIPELINE_FILE_TYPE],
    modelName: 'text',
    events: options.events,
    trans,
    showJob: id => void commands.execute(CommandIDs.showJob, { id }),
    files: options.fileBrowser?.model.manager ?? null
  });
  docRegistry.addWidgetFactory(factory);

  const tracker = new WidgetTracker<PipelineWidget>({
    namespace: 'remote-compute-pipeline'
  });
  factory.widgetCreated.connect((_, widget) => {
    widget.context.pathChanged.connect(() => void tracker.save(widget));
    void tracker.add(widget);
  });
  if (options.restorer) {
    void options.restorer.restore(tracker, {
      command: 'docmanager:open',
      args: widget => ({
        path: widget.context.path,
        factory: PIPELINE_FACTORY
      }),
      name: widget => widget.context.path
    });
  }

  commands.addCommand(CommandIDs.newPipeline, {
    // As JupyterLab names a notebook: "Pipeline" on the launcher and under File › New, "New
    // Pipeline" in the palette, where it stands among other commands.
    label: args =>
      args.isPalette ? trans.__('New Pipeline') : trans.__('Pipeline'),
    caption: trans.__(
      'A new pipeline of steps, each a job on a machine, drawn on a canvas'
    ),
    icon: args => (args.isPalette ? undefined : pipelineIcon),
    execute: async args => {
      const cwd =
        stringArg(args, 'cwd') || options.fileBrowser?.model.path || '';
      const contents = app.serviceManager.contents;
      const created = await contents.newUntitled({
        path: cwd,
        type: 'file',
        ext: PIPELINE_EXTENSION
      });
      // A valid empty pipeline from the start, so the file on disk always reads as one.
      await contents.save(created.path, {
        type: 'file',
        format: 'text',
        content: serializePipeline(emptyPipeline())
      });
      return commands.execute('docmanager:open', {
        path: created.path,
        factory: PIPELINE_FACTORY
      });
    }
  });

  const current = (): PipelineWidget | null =>
    tracker.currentWidget !== null &&
    tracker.currentWidget === app.shell.currentWidget
      ? tracker.currentWidget
      : null;
  commands.addCommand(CommandIDs.runPipeline, {
    label: trans.__('Run Pipeline'),
    caption: trans.__('Save the pipeline and run it on its machines'),
    isEnabled: () => current() !== null,
    execute: () => {
      const widget = current();
      return widget ? nameAndRun(widget.content.model, trans) : undefined;
    }
  });
  commands.addCommand(CommandIDs.cancelPipeline, {
    // With an id (a sweep's Cancel in the panel): that run; else the current canvas's run.
    label: args =>
      args.id ? trans.__('Cancel Sweep') : trans.__('Cancel Pipeline Run'),
    isEnabled: args =>
      !!args.id || current()?.content.model.run?.state === 'running',
    execute: async args => {
      if (typeof args.id !== 'string') {
        return current()?.content.model.cancel();
      }
      try {
        await cancelPipelineRun(args.id);
      } catch (error) {
        showError(trans.__('Could not cancel the run'), error, trans);
      }
    }
  });

  options.launcher?.add({
    command: CommandIDs.newPipeline,
    args: { isLauncher: true },
    category: trans.__('Other'),
    rank: 20
  });
  options.mainMenu?.fileMenu.newMenu.addItem({
    command: CommandIDs.newPipeline,
    rank: 40
  });
  if (options.palette) {
    const category = trans.__('Compute');
    for (const command of [
      CommandIDs.newPipeline,
      CommandIDs.runPipeline,
      CommandIDs.cancelPipeline
    ]) {
      options.palette.addItem({ command, category, args: { isPalette: true } });
    }
  }
}
