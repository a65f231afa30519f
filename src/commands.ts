/**
 * Commands of the extension: the panel, the palette, menus and shortcuts share them.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';
import { refreshIcon } from '@jupyterlab/ui-components';

import { ComputePanel } from './components/ComputePanel';
import { computeIcon } from './icons';

export namespace CommandIDs {
  export const open = 'remote-compute:open';
  export const refresh = 'remote-compute:refresh';
}

export function registerCommands(
  app: JupyterFrontEnd,
  options: {
    panel: ComputePanel;
    trans: TranslationBundle;
    palette: ICommandPalette | null;
  }
): void {
  const { panel, trans, palette } = options;
  const category = trans.__('Compute');

  app.commands.addCommand(CommandIDs.open, {
    label: trans.__('Open Compute panel'),
    caption: trans.__('Show machines and jobs in the left sidebar'),
    icon: computeIcon,
    execute: () => {
      app.shell.activateById(panel.id);
    }
  });

  app.commands.addCommand(CommandIDs.refresh, {
    label: trans.__('Refresh machines and jobs'),
    icon: refreshIcon,
    execute: () => panel.model.refresh()
  });

  if (palette) {
    palette.addItem({ command: CommandIDs.open, category });
    palette.addItem({ command: CommandIDs.refresh, category });
  }
}
