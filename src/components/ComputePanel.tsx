/**
 * The Compute panel (left sidebar): machines and jobs, or a clear message when the
 * server extension is not answering. Every action goes through a command.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import {
  launchIcon,
  ReactWidget,
  refreshIcon,
  tableRowsIcon,
  ToolbarButtonComponent
} from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';
import { Message } from '@lumino/messaging';
import * as React from 'react';

import { APIError, SERVER_EXTENSION } from '../api';
import { computeIcon } from '../icons';
import { ComputeModel } from '../model';
import { PipelineRuns } from '../pipelineRuns';
import { useSignal } from './common';
import { Jobs, PANEL_SCROLLER } from './JobList';
import { Machines } from './MachineList';
import { OrganizationSection } from './OrganizationSection';
import { PipelineRunList } from './PipelineRunList';
import { Secrets } from './Secrets';

/**
 * The id of the panel in the shell (also used by the layout restorer and commands).
 */
export const PANEL_ID = 'jp-remote-compute-panel';

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

function ComputePanelComponent(props: {
  model: ComputeModel;
  runs: PipelineRuns | null;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element {
  const { model, runs, commands, trans } = props;
  useSignal(model.changed);

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
        <Machines model={model} commands={commands} trans={trans} />
        <Secrets trans={trans} />
        {/* Only for the organization's admins; the service refuses anyone else all the same. */}
        {model.isOrgAdmin && (
          <OrganizationSection
            model={model}
            commands={commands}
            trans={trans}
          />
        )}
        {runs && (
          <PipelineRunList
            runs={runs}
            jobOf={id => model.job(id)}
            commands={commands}
            trans={trans}
          />
        )}
        {/* Last: the list pages in as it scrolls, so nothing below it could be reached. */}
        <Jobs model={model} commands={commands} trans={trans} />
      </>
    );
  }

  return (
    <div className="jp-RemoteCompute-panelContent">
      <div className="jp-RemoteCompute-header">
        <h2 className="jp-RemoteCompute-title">{trans.__('Compute')}</h2>
        <ToolbarButtonComponent
          icon={tableRowsIcon}
          label={trans.__('Usage')}
          tooltip={trans.__('Show job-hours and GPU-hours per machine')}
          onClick={() => void commands.execute('remote-compute:show-usage')}
        />
        <ToolbarButtonComponent
          icon={launchIcon}
          label={trans.__('MLflow')}
          tooltip={trans.__("Open MLflow's UI on the workspace's runs")}
          onClick={() => void commands.execute('remote-compute:open-mlflow')}
        />
        <ToolbarButtonComponent
          icon={refreshIcon}
          onClick={() => {
            void model.refresh().catch(() => undefined);
            void runs?.refresh();
          }}
          tooltip={trans.__('Refresh machines and jobs')}
        />
      </div>
      <div className={`jp-RemoteCompute-body ${PANEL_SCROLLER}`}>{body}</div>
    </div>
  );
}

/**
 * The sidebar widget; the model's fallback poll runs while it is visible.
 */
export class ComputePanel extends ReactWidget {
  constructor(options: ComputePanel.IOptions) {
    super();
    this._model = options.model;
    this._runs = options.runs ?? null;
    this._trans = options.trans;
    this._commands = options.commands;
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
    return (
      <ComputePanelComponent
        model={this._model}
        runs={this._runs}
        commands={this._commands}
        trans={this._trans}
      />
    );
  }

  private _commands: CommandRegistry;
  private _model: ComputeModel;
  private _runs: PipelineRuns | null;
  private _trans: TranslationBundle;
}

export namespace ComputePanel {
  export interface IOptions {
    model: ComputeModel;
    /**
     * The latest pipeline runs, listed above the jobs; none: the list is left out.
     */
    runs?: PipelineRuns | null;
    commands: CommandRegistry;
    trans: TranslationBundle;
  }
}
