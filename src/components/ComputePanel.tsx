/**
 * The Compute panel (left sidebar): machines and jobs, or a clear message when the
 * server extension is not answering.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import {
  ReactWidget,
  refreshIcon,
  ToolbarButtonComponent
} from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import * as React from 'react';

import { APIError, IJob, IMachine, SERVER_EXTENSION } from '../api';
import { computeIcon } from '../icons';
import { ComputeModel } from '../model';

/**
 * The id of the panel in the shell (also used by the layout restorer and commands).
 */
export const PANEL_ID = 'jp-remote-compute-panel';

/**
 * Re-render whenever the model changes.
 */
function useModel(model: ComputeModel): void {
  const [, setVersion] = React.useState(0);
  React.useEffect(() => {
    const onChange = (): void => setVersion(v => v + 1);
    model.changed.connect(onChange);
    return () => {
      model.changed.disconnect(onChange);
    };
  }, [model]);
}

function ServerMissing(props: {
  error: APIError;
  trans: TranslationBundle;
}): JSX.Element {
  const { error, trans } = props;
  const enable = `jupyter server extension enable ${SERVER_EXTENSION}`;
  return (
    <div className="jp-RemoteCompute-error" role="alert">
      <p className="jp-RemoteCompute-errorTitle">
        {trans.__(
          'The server extension %1 is not answering.',
          SERVER_EXTENSION
        )}
      </p>
      <p>
        {trans.__(
          'The Compute panel needs the server part of jupyter-remote-compute. Enable it, then restart JupyterLab:'
        )}
      </p>
      <pre className="jp-RemoteCompute-command">{enable}</pre>
      <p>
        {trans.__(
          'Check with: jupyter server extension list (it should show %1 enabled and OK).',
          SERVER_EXTENSION
        )}
      </p>
      <p className="jp-RemoteCompute-errorDetail">
        {trans.__('Details: %1', error.message)}
      </p>
    </div>
  );
}

function RequestFailed(props: {
  error: APIError;
  trans: TranslationBundle;
}): JSX.Element {
  const { error, trans } = props;
  return (
    <div className="jp-RemoteCompute-error" role="alert">
      <p className="jp-RemoteCompute-errorTitle">
        {trans.__('Could not load machines and jobs.')}
      </p>
      <p className="jp-RemoteCompute-errorDetail">
        {error.fromServerExtension
          ? trans.__('%1 (%2)', error.message, error.code)
          : error.message}
      </p>
    </div>
  );
}

function MachineList(props: {
  machines: readonly IMachine[];
  trans: TranslationBundle;
}): JSX.Element {
  const { machines, trans } = props;
  if (machines.length === 0) {
    return <p className="jp-RemoteCompute-empty">{trans.__('No machines.')}</p>;
  }
  return (
    <ul className="jp-RemoteCompute-list" aria-label={trans.__('Machines')}>
      {machines.map(machine => (
        <li
          key={machine.name}
          className="jp-RemoteCompute-item"
          data-enabled={machine.enabled ? 'true' : 'false'}
        >
          <span className="jp-RemoteCompute-itemName">
            {machine.builtin ? trans.__('This machine') : machine.name}
          </span>
          <span className="jp-RemoteCompute-itemDetail">
            {machine.kind}
            {machine.address ? ` · ${machine.address}` : ''}
            {machine.enabled ? '' : ` · ${trans.__('disabled')}`}
          </span>
        </li>
      ))}
    </ul>
  );
}

function JobList(props: {
  jobs: readonly IJob[];
  trans: TranslationBundle;
}): JSX.Element {
  const { jobs, trans } = props;
  if (jobs.length === 0) {
    return <p className="jp-RemoteCompute-empty">{trans.__('No jobs yet.')}</p>;
  }
  return (
    <ul className="jp-RemoteCompute-list" aria-label={trans.__('Jobs')}>
      {jobs.map(job => (
        <li key={job.id} className="jp-RemoteCompute-item" title={job.id}>
          <span className="jp-RemoteCompute-itemName">
            {job.name || job.id}
          </span>
          <span
            className="jp-RemoteCompute-state"
            data-state={job.state}
            title={job.reason ?? undefined}
          >
            {job.state}
          </span>
          <span className="jp-RemoteCompute-itemDetail">{job.machine}</span>
        </li>
      ))}
    </ul>
  );
}

function ComputePanelComponent(props: {
  model: ComputeModel;
  trans: TranslationBundle;
}): JSX.Element {
  const { model, trans } = props;
  useModel(model);

  const error = model.error;
  let body: JSX.Element;
  if (error?.serverExtensionMissing) {
    body = <ServerMissing error={error} trans={trans} />;
  } else if (model.loading) {
    body = <p className="jp-RemoteCompute-empty">{trans.__('Loading…')}</p>;
  } else {
    body = (
      <>
        {error && <RequestFailed error={error} trans={trans} />}
        <section aria-labelledby="jp-RemoteCompute-machines-heading">
          <h3
            id="jp-RemoteCompute-machines-heading"
            className="jp-RemoteCompute-sectionTitle"
          >
            {trans.__('Machines')}
          </h3>
          <MachineList machines={model.machines} trans={trans} />
        </section>
        <section aria-labelledby="jp-RemoteCompute-jobs-heading">
          <h3
            id="jp-RemoteCompute-jobs-heading"
            className="jp-RemoteCompute-sectionTitle"
          >
            {trans.__('Jobs')}
          </h3>
          <JobList jobs={model.jobs} trans={trans} />
        </section>
        {model.settings.mlflowUiUrl && (
          <p className="jp-RemoteCompute-footer">
            <a
              href={model.settings.mlflowUiUrl}
              target="_blank"
              rel="noopener noreferrer"
            >
              {trans.__('Open the MLflow UI')}
            </a>
          </p>
        )}
      </>
    );
  }

  return (
    <div className="jp-RemoteCompute-panelContent">
      <div className="jp-RemoteCompute-header">
        <h2 className="jp-RemoteCompute-title">{trans.__('Compute')}</h2>
        <ToolbarButtonComponent
          icon={refreshIcon}
          onClick={() => void model.refresh()}
          tooltip={trans.__('Refresh machines and jobs')}
        />
      </div>
      <div className="jp-RemoteCompute-body">{body}</div>
    </div>
  );
}

/**
 * The sidebar widget; the model refreshes while it is visible.
 */
export class ComputePanel extends ReactWidget {
  constructor(options: ComputePanel.IOptions) {
    super();
    this._model = options.model;
    this._trans = options.trans;
    this.id = PANEL_ID;
    this.addClass('jp-RemoteCompute-panel');
    this.title.icon = computeIcon;
    this.title.caption = this._trans.__('Compute');
  }

  get model(): ComputeModel {
    return this._model;
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._model.active = true;
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._model.active = false;
  }

  render(): JSX.Element {
    return <ComputePanelComponent model={this._model} trans={this._trans} />;
  }

  private _model: ComputeModel;
  private _trans: TranslationBundle;
}

export namespace ComputePanel {
  export interface IOptions {
    model: ComputeModel;
    trans: TranslationBundle;
  }
}
