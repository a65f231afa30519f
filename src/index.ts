import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';

import { registerCommands } from './commands';
import { ComputePanel } from './components/ComputePanel';
import { ComputeModel, IComputeSettings } from './model';

export { APIError, listJobs, listMachines, requestAPI } from './api';
export type { IJob, IMachine, JobState } from './api';
export { CommandIDs } from './commands';

const PLUGIN_ID = 'jupyter-remote-compute:plugin';

/**
 * The Compute panel in the left sidebar and its commands.
 */
const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'Run a training job on a named machine and follow it from the Compute panel.',
  autoStart: true,
  optional: [ITranslator, ICommandPalette, ILayoutRestorer, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    translator: ITranslator | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    settingRegistry: ISettingRegistry | null
  ): void => {
    const trans = (translator ?? nullTranslator).load('jupyter_remote_compute');

    const model = new ComputeModel({ events: app.serviceManager.events });
    const panel = new ComputePanel({ model, trans });
    app.shell.add(panel, 'left', { rank: 650 });
    if (restorer) {
      restorer.add(panel, 'jupyter-remote-compute');
    }

    registerCommands(app, { panel, trans, palette });

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
  }
};

export default plugin;
