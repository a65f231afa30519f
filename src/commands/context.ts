/**
 * What every command shares: its id, what it acts on, and how it reads its arguments.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';

import { ComputePanel } from '../components/ComputePanel';
import { PickFiles } from '../filePicker';
import { ComputeModel } from '../model';

export namespace CommandIDs {
  export const open = 'remote-compute:open';
  export const refresh = 'remote-compute:refresh';
  export const addMachine = 'remote-compute:add-machine';
  export const editMachine = 'remote-compute:edit-machine';
  export const duplicateMachine = 'remote-compute:duplicate-machine';
  export const removeMachine = 'remote-compute:remove-machine';
  export const checkMachine = 'remote-compute:check-machine';
  export const enableMachine = 'remote-compute:enable-machine';
  export const addPool = 'remote-compute:add-pool';
  export const editPool = 'remote-compute:edit-pool';
  export const removePool = 'remote-compute:remove-pool';
  export const addOrgMachine = 'remote-compute:add-org-machine';
  export const editOrgMachine = 'remote-compute:edit-org-machine';
  export const removeOrgMachine = 'remote-compute:remove-org-machine';
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
  export const showOrgUsage = 'remote-compute:show-org-usage';
  export const openMlflow = 'remote-compute:open-mlflow';
  export const newPipeline = 'remote-compute:new-pipeline';
  export const runPipeline = 'remote-compute:run-pipeline';
  export const cancelPipeline = 'remote-compute:cancel-pipeline';
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
   * The path of the file selected in the file browser, if any (for "Run on a Machine…").
   */
  selectedFile?: () => string | null;
  /**
   * Picks workspace files for the forms that name them; none without a file browser.
   */
  pickFiles?: PickFiles | null;
}

export function stringArg(
  args: ReadonlyPartialJSONObject,
  key: string
): string {
  const value = args[key];
  return typeof value === 'string' ? value : '';
}
