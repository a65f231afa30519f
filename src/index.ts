import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { ILauncher } from '@jupyterlab/launcher';
import { IMainMenu } from '@jupyterlab/mainmenu';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import {
  ITranslator,
  nullTranslator,
  TranslationBundle
} from '@jupyterlab/translation';
import * as React from 'react';

import { AGENT_FACES } from './agent';
import { APIError, IJob, SERVER_EXTENSION } from './api';
import { CommandIDs, registerCommands } from './commands';
import { ComputePanel } from './components/ComputePanel';
import { EventSocket } from './eventsocket';
import { filePicker } from './filePicker';
import { PipelineRuns } from './pipelineRuns';
import { IKindFacesRegistry, kindFaces } from './kindFaces';
import { ComputeModel, IComputeSettings } from './model';
import { registerPipelines } from './pipeline/commands';

export { APIError, listJobs, listMachines, requestAPI } from './api';
export type { IJob, IMachine, JobState } from './api';
export { CommandIDs } from './commands';
export { IKindFacesRegistry } from './kindFaces';
export type { IKindFaces } from './kindFaces';

const PLUGIN_ID = 'jupyter-remote-compute:plugin';

/**
 * Say when a job ends, whether or not the panel is open.
 */
function notifyJobEnded(
  app: JupyterFrontEnd,
  job: IJob,
  trans: TranslationBundle
): void {
  const name = job.name || job.id;
  const actions: Notification.IAction[] = [
    {
      label: trans.__('Show Log'),
      caption: trans.__('Open the job and its log'),
      callback: () => {
        void app.commands.execute(CommandIDs.showJob, { id: job.id });
      }
    }
  ];
  const outputs = Object.keys(job.outputs ?? {});
  if (job.state === 'succeeded' && outputs.length > 0) {
    actions.push({
      label: trans.__('Open Outputs'),
      caption: outputs.join(', '),
      displayType: 'accent',
      callback: () => {
        void app.commands.execute(CommandIDs.openOutputs, { id: job.id });
      }
    });
  }
  switch (job.state) {
    case 'succeeded':
      Notification.success(
        trans.__('Job %1 on %2 succeeded.', name, job.machine),
        { autoClose: 10000, actions }
      );
      break;
    case 'cancelled':
      Notification.warning(
        trans.__('Job %1 on %2 was cancelled.', name, job.machine),
        { autoClose: 10000, actions }
      );
      break;
    default:
      Notification.error(
        job.state === 'lost'
          ? trans.__(
              'Job %1 on %2 was lost: %3',
              name,
              job.machine,
              job.reason ?? ''
            )
          : trans.__(
              'Job %1 on %2 failed: %3',
              name,
              job.machine,
              job.reason ?? ''
            ),
        { autoClose: false, actions }
      );
  }
}

/**
 * Say when a job's attempt ended and it goes back to the queue as its next attempt (on a fallback
 * machine after a machine's fault): the job's reason says which attempt, why and where.
 */
function notifyJobRetried(
  app: JupyterFrontEnd,
  job: IJob,
  trans: TranslationBundle
): void {
  Notification.warning(
    trans.__('Job %1 runs again: %2', job.name || job.id, job.reason ?? ''),
    {
      autoClose: 10000,
      actions: [
        {
          label: trans.__('Show Job'),
          caption: trans.__('Open the job, its attempts and its log'),
          callback: () => {
            void app.commands.execute(CommandIDs.showJob, { id: job.id });
          }
        }
      ]
    }
  );
}

function showServerMissing(error: APIError, trans: TranslationBundle): void {
  const command = `jupyter server extension enable ${SERVER_EXTENSION}`;
  const body = React.createElement(
    'div',
    { className: 'jp-RemoteCompute-dialogBody' },
    React.createElement(
      'p',
      null,
      trans.__(
        'The Compute panel needs the server part of jupyter-remote-compute (%1), and it does not answer at /remote-compute/.',
        SERVER_EXTENSION
      )
    ),
    React.createElement(
      'p',
      null,
      trans.__('Enable it, then restart JupyterLab:')
    ),
    React.createElement(
      'pre',
      { className: 'jp-RemoteCompute-command' },
      command
    ),
    React.createElement(
      'p',
      null,
      trans.__(
        'Check with: jupyter server extension list (it should show %1 enabled and OK).',
        SERVER_EXTENSION
      )
    ),
    React.createElement(
      'p',
      { className: 'jp-RemoteCompute-errorDetail' },
      trans.__('Details: %1', error.message)
    )
  );
  void showDialog({
    title: trans.__('The remote-compute server extension is missing'),
    body,
    buttons: [Dialog.okButton({ label: trans.__('OK') })]
  });
}

/**
 * The Compute panel in the left sidebar and its commands.
 */
const plugin: JupyterFrontEndPlugin<IKindFacesRegistry> = {
  id: PLUGIN_ID,
  description:
    'Run a training job on a named machine and follow it from the Compute panel; draw and run pipelines of jobs.',
  autoStart: true,
  provides: IKindFacesRegistry,
  optional: [
    ITranslator,
    ICommandPalette,
    ILayoutRestorer,
    ISettingRegistry,
    IDefaultFileBrowser,
    ILauncher,
    IMainMenu
  ],
  activate: (
    app: JupyterFrontEnd,
    translator: ITranslator | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    settingRegistry: ISettingRegistry | null,
    fileBrowser: IDefaultFileBrowser | null,
    launcher: ILauncher | null,
    mainMenu: IMainMenu | null
  ): IKindFacesRegistry => {
    const trans = (translator ?? nullTranslator).load('jupyter_remote_compute');
    // The kinds that add to the panel (the server's engines/faces.py BUILT_IN_FACES, this side).
    kindFaces.register('agent', AGENT_FACES);

    // A socket of our own: the panel polls only while it is down, which JupyterLab's shared
    // event manager does not tell.
    const events = new EventSocket({
      serverSettings: app.serviceManager.serverSettings
    });
    const model = new ComputeModel({ events });
    const runs = new PipelineRuns({ events });
    const panel = new ComputePanel({
      model,
      runs,
      trans,
      commands: app.commands
    });
    app.shell.add(panel, 'left', { rank: 650 });
    if (restorer) {
      restorer.add(panel, 'jupyter-remote-compute');
    }

    registerCommands({
      app,
      model,
      panel,
      trans,
      palette,
      selectedFile: () => {
        if (!fileBrowser) {
          return null;
        }
        const item = fileBrowser.selectedItems().next();
        return item && !item.done && item.value.type !== 'directory'
          ? item.value.path
          : null;
      },
      // The dialog opens where the file browser is.
      pickFiles: fileBrowser
        ? filePicker(fileBrowser.model.manager, () => fileBrowser.model.path)
        : null
    });

    // Pipelines follow their runs on the same socket as the panel's jobs.
    registerPipelines({
      app,
      events,
      trans,
      palette,
      launcher,
      mainMenu,
      restorer,
      fileBrowser
    });

    if (fileBrowser) {
      app.contextMenu.addItem({
        command: CommandIDs.runFile,
        selector: '.jp-DirListing-item[data-file-type="python"]',
        rank: 60
      });
    }

    model.jobEnded.connect((_, job) => notifyJobEnded(app, job, trans));
    model.jobRetried.connect((_, job) => notifyJobRetried(app, job, trans));
    model.serverMissing.connect((_, error) => showServerMissing(error, trans));

    // One quiet load at start: the model then knows which jobs are running, so it can say
    // when they end even if the panel stays closed. Events keep it current afterwards.
    void app.restored.then(() => {
      void model.refresh().catch(() => undefined);
      void runs.refresh();
    });

    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          const apply = (): void => {
            model.configure(
              settings.composite as unknown as Partial<IComputeSettings>
            );
          };
          apply();
          settings.changed.connect(apply);
        })
        .catch(reason => {
          console.error(
            'jupyter-remote-compute: could not load settings, using defaults.',
            reason
          );
        });
    }
    return kindFaces;
  }
};

export default plugin;
