/**
 * The pipeline document's widget and its factory: a `*.rcpipeline` file opens as a canvas, and is
 * saved, reverted and renamed by the document manager like any document.
 */
import {
  ABCWidgetFactory,
  DocumentRegistry,
  DocumentWidget
} from '@jupyterlab/docregistry';
import { Notification } from '@jupyterlab/apputils';
import { PathExt } from '@jupyterlab/coreutils';
import { FileDialog } from '@jupyterlab/filebrowser';
import { TranslationBundle } from '@jupyterlab/translation';
import { ReactWidget } from '@jupyterlab/ui-components';
import * as React from 'react';

import { IJobEvents } from '../eventsocket';
import { pipelineIcon } from '../icons';
import { filePicker, PickFiles } from '../filePicker';
import { PipelineModel } from './model';

// The canvas (React Flow, the form's JSON Schema validator) loads when a pipeline is first opened,
// not with JupyterLab.
const PipelineCanvas = React.lazy(() =>
  import('./PipelineCanvas').then(m => ({ default: m.PipelineCanvas }))
);

export const PIPELINE_FACTORY = 'Remote Compute Pipeline';
export const PIPELINE_FILE_TYPE = 'remote-compute-pipeline';

export class PipelineView extends ReactWidget {
  constructor(options: {
    model: PipelineModel;
    trans: TranslationBundle;
    showJob: (jobId: string) => void;
    pickFiles: PickFiles | null;
  }) {
    super();
    this._options = options;
    this.addClass('jp-RemoteCompute-pipelineView');
  }

  get model(): PipelineModel {
    return this._options.model;
  }

  dispose(): void {
    this._options.model.dispose();
    super.dispose();
  }

  protected render(): JSX.Element {
    return (
      <React.Suspense
        fallback={
          <div className="jp-RemoteCompute-empty">
            {this._options.trans.__('Loading the canvas…')}
          </div>
        }
      >
        <PipelineCanvas {...this._options} />
      </React.Suspense>
    );
  }

  private _options: {
    model: PipelineModel;
    trans: TranslationBundle;
    showJob: (jobId: string) => void;
    pickFiles: PickFiles | null;
  };
}

export class PipelineWidget extends DocumentWidget<PipelineView> {}

export class PipelineFactory extends ABCWidgetFactory<PipelineWidget> {
  constructor(options: PipelineFactory.IOptions) {
    super(options);
    this._events = options.events;
    this._trans = options.trans;
    this._showJob = options.showJob;
    this._files = options.files;
  }

  protected createNewWidget(context: DocumentRegistry.Context): PipelineWidget {
    const model = new PipelineModel({ context, events: this._events });
    const files = this._files;
    const content = new PipelineView({
      model,
      trans: this._trans,
      showJob: this._showJob,
      // The dialog opens at the pipeline's folder, where it is now (the file may be renamed).
      pickFiles: files
        ? filePicker(files, () => PathExt.dirname(context.path))
        : null
    });
    const widget = new PipelineWidget({ context, content });
    widget.title.icon = pipelineIcon;
    refuseToWriteUndrawable(context, model, this._trans);
    return widget;
  }

  private _events: IJobEvents | null;
  private _files: FileDialog.IFileOptions['manager'] | null;
  private _showJob: (jobId: string) => void;
  private _trans: TranslationBundle;
}

/**
 * A file the canvas cannot draw is shown as it is and never written: every save (Ctrl+S, Save All,
 * autosave) goes through the context, which would otherwise write the document's text back over it.
 */
function refuseToWriteUndrawable(
  context: DocumentRegistry.Context,
  model: PipelineModel,
  trans: TranslationBundle
): void {
  const save = context.save.bind(context);
  context.save = async () => {
    if (model.formatError === null) {
      return save();
    }
    Notification.warning(
      trans.__(
        '%1 was not saved: it cannot be drawn (%2). Fix it in a text editor.',
        PathExt.basename(context.path),
        model.formatError
      ),
      { autoClose: 5000 }
    );
  };
}

export namespace PipelineFactory {
  export interface IOptions extends DocumentRegistry.IWidgetFactoryOptions<PipelineWidget> {
    events: IJobEvents | null;
    trans: TranslationBundle;
    showJob: (jobId: string) => void;
    /**
     * The document manager the file dialog browses with; null: file settings are typed only.
     */
    files: FileDialog.IFileOptions['manager'] | null;
  }
}
