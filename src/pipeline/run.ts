/**
 * Run the pipeline in front, naming it first if it still has the name it was made with: the
 * Compute panel lists runs by their file's name, and ten `untitled.rcpipeline` runs say nothing.
 */
import { InputDialog } from '@jupyterlab/apputils';
import { PathExt } from '@jupyterlab/coreutils';
import { TranslationBundle } from '@jupyterlab/translation';

import { PipelineModel } from './model';

const UNTITLED = /^untitled\d*\.rcpipeline$/i;

export async function nameAndRun(
  model: PipelineModel,
  trans: TranslationBundle
): Promise<void> {
  const name = PathExt.basename(model.path);
  if (UNTITLED.test(name)) {
    const answer = await InputDialog.getText({
      title: trans.__('Name the pipeline'),
      label: trans.__('Its runs are listed in the Compute panel by this name.'),
      text: name,
      selectionRange: name.length - PathExt.extname(name).length,
      okLabel: trans.__('Rename and Run')
    });
    if (!answer.button.accept || !answer.value?.trim()) {
      return;
    }
    let chosen = answer.value.trim();
    if (!chosen.toLowerCase().endsWith('.rcpipeline')) {
      chosen += '.rcpipeline';
    }
    if (chosen !== name) {
      await model.rename(chosen);
    }
  }
  await model.start();
}
