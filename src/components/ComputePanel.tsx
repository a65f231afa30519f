/**
 * The Compute panel (left sidebar): machines and jobs, or a clear message when the
 * server extension is not answering. Every action goes through a command.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import {
  addIcon,
  clearIcon,
  ellipsesIcon,
  launchIcon,
  ReactWidget,
  refreshIcon,
  runIcon,
  tableRowsIcon,
  ToolbarButtonComponent
} from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';
import { Message } from '@lumino/messaging';
import { Menu } from '@lumino/widgets';
import * as React from 'react';

import { ALL_STATES, APIError, IJob, IMachine, SERVER_EXTENSION } from '../api';
import { computeIcon } from '../icons';
import { facesOf } from '../kindFaces';
import { ComputeModel } from '../model';
import { PipelineRuns } from '../pipelineRuns';
import {
  JobDuration,
  KindIcon,
  RelativeTime,
  StateBadge,
  stateLabel,
  useSignal
} from './common';
import { PipelineRunList } from './PipelineRunList';
import { Secrets } from './Secrets';

/**
 * The id of the panel in the shell (also used by the layout restorer and commands).
 */
export const PANEL_ID = 'jp-remote-compute-panel';

/**
 * Height of one job row in pixels (the list is windowed on it; keep in sync with the CSS).
 */
export const JOB_ROW_HEIGHT = 46;
// The panel's one scroller, which the job list follows.
const PANEL_SCROLLER = 'jp-RemoteCompute-panelScroller';

/**
 * Rows below the visible ones at which the next page is asked for.
 */
const PREFETCH_ROWS = 50;

/**
 * Milliseconds of no typing before a name search goes to the server.
 */
const SEARCH_DELAY = 300;

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

/**
 * Edit, duplicate, remove: the machine's less frequent actions, as a menu of commands.
 */
function openMachineMenu(
  commands: CommandRegistry,
  name: string,
  anchor: HTMLElement | null,
  kind?: string
): void {
  const menu = new Menu({ commands });
  menu.addClass('jp-RemoteCompute-menu');
  for (const command of [
    'remote-compute:edit-machine',
    'remote-compute:duplicate-machine',
    ...(facesOf(kind).machineCommands ?? []),
    'remote-compute:remove-machine'
  ]) {
    menu.addItem({ command, args: { name } });
  }
  menu.aboutToClose.connect(() => {
    // Disposed after the click that closed it was handled.
    requestAnimationFrame(() => menu.dispose());
  });
  const rect = anchor?.getBoundingClientRect();
  menu.open(rect ? rect.left : 0, rect ? rect.bottom : 0);
}

function MachineRow(props: {
  machine: IMachine;
  model: ComputeModel;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element {
  const { machine, model, commands, trans } = props;
  const check = model.lastCheck(machine.name);
  const kindLabel =
    model.kinds.find(k => k.kind === machine.kind)?.label || machine.kind;
  const displayName = machine.builtin ? trans.__('This machine') : machine.name;
  // The organization's machines are set by its admins in the hub's service: shown, not changed here.
  const ours = isOrganizations(machine);
  const args = { name: machine.name };
  const Beside = facesOf(machine.kind).Beside;
  return (
    <li
      className="jp-RemoteCompute-machine"
      data-enabled={machine.enabled ? 'true' : 'false'}
      aria-label={displayName}
    >
      <div className="jp-RemoteCompute-machineMain">
        <KindIcon kind={machine.kind} label={kindLabel} />
        <span className="jp-RemoteCompute-itemName">{displayName}</span>
        {!machine.builtin && !ours && (
          <label
            className="jp-RemoteCompute-switch"
            title={
              machine.enabled
                ? trans.__('Enabled: jobs may run on %1', machine.name)
                : trans.__('Disabled: no job runs on %1', machine.name)
            }
          >
            <input
              type="checkbox"
              role="switch"
              checked={machine.enabled}
              aria-label={trans.__('Enabled: %1', machine.name)}
              onChange={e =>
                void commands.execute('remote-compute:enable-machine', {
                  name: machine.name,
                  enabled: e.target.checked
                })
              }
            />
            {trans.__('Enabled')}
          </label>
        )}
        <span className="jp-RemoteCompute-rowActions">
          {!ours && (
            <button
              type="button"
              className="jp-RemoteCompute-checkButton"
              aria-label={trans.__('Check %1', displayName)}
              title={trans.__(
                'Check %1: connect, and read its facts (Python, GPUs, disk)',
                displayName
              )}
              onClick={() =>
                void commands.execute('remote-compute:check-machine', args)
              }
            >
              {trans.__('Check')}
            </button>
          )}
          {!machine.builtin && !ours && (
            <ToolbarButtonComponent
              icon={ellipsesIcon}
              tooltip={trans.__('More actions for %1', machine.name)}
              onClick={() => {
                const button = document.activeElement as HTMLElement | null;
                openMachineMenu(commands, machine.name, button, machine.kind);
              }}
            />
          )}
        </span>
      </div>
      <div className="jp-RemoteCompute-machineLine">
        <span className="jp-RemoteCompute-itemDetail jp-RemoteCompute-machineFacts">
          {ours && machine.admin && (
            <span
              className="jp-RemoteCompute-owner"
              title={trans.__(
                "The organization's machine, set by %1 in the hub's service",
                machine.admin
              )}
            >
              {trans.__('set by %1', machine.admin)}
              {' · '}
            </span>
          )}
          <span className="jp-RemoteCompute-address" title={machine.address}>
            {machine.builtin
              ? trans.__('built in, always there')
              : machine.address}
          </span>
          {Beside && <Beside machine={machine} trans={trans} />}

          {machine.created && (
            <>
              {' · '}
              <RelativeTime
                when={machine.created}
                trans={trans}
                format={ago => trans.__('added %1', ago)}
              />
            </>
          )}
        </span>
      </div>
      {check && (
        <div
          className="jp-RemoteCompute-check"
          data-ok={check.ok ? 'true' : 'false'}
        >
          <RelativeTime
            when={check.at}
            trans={trans}
            title={check.ok ? JSON.stringify(check.facts) : check.message}
            format={ago =>
              check.ok
                ? trans.__('Check passed %1', ago)
                : trans.__('Check failed %1: %2', ago, check.message)
            }
          />
        </div>
      )}
    </li>
  );
}

function Machines(props: {
  model: ComputeModel;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element {
  const { model, commands, trans } = props;
  const builtin = model.machines.filter(m => m.builtin);
  const others = model.machines.filter(m => !m.builtin && !isOrganizations(m));
  const organizations = model.machines.filter(isOrganizations);
  const rowProps = { model, commands, trans };
  return (
    <section
      className="jp-RemoteCompute-machines"
      aria-labelledby="jp-RemoteCompute-machines-heading"
    >
      <div className="jp-RemoteCompute-sectionHeader">
        <h3
          id="jp-RemoteCompute-machines-heading"
          className="jp-RemoteCompute-sectionTitle"
        >
          {trans.__('Machines')}
        </h3>
        <ToolbarButtonComponent
          icon={addIcon}
          label={trans.__('Add a machine')}
          tooltip={trans.__(
            'Add a machine to run jobs on: SSH, Jupyter Server, Slurm, agent or SkyPilot'
          )}
          onClick={() => void commands.execute('remote-compute:add-machine')}
        />
      </div>
      <MachineList
        machines={builtin}
        className="jp-RemoteCompute-list jp-RemoteCompute-builtin"
        label={trans.__('Built-in machine')}
        {...rowProps}
      />
      {others.length > 0 && (
        <MachineList
          machines={others}
          className="jp-RemoteCompute-list"
          label={trans.__('Machines')}
          {...rowProps}
        />
      )}
      {others.length === 0 && organizations.length === 0 && (
        <EmptyMachines trans={trans} />
      )}
      {organizations.length > 0 && (
        <>
          <h4 className="jp-RemoteCompute-subsectionTitle">
            {trans.__('Organization')}
          </h4>
          <MachineList
            machines={organizations}
            className="jp-RemoteCompute-list"
            label={trans.__("The organization's machines")}
            {...rowProps}
          />
        </>
      )}
    </section>
  );
}

/**
 * One group of machines, a row each.
 */
function MachineList(props: {
  machines: readonly IMachine[];
  className: string;
  label: string;
  model: ComputeModel;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element {
  const { machines, className, label, model, commands, trans } = props;
  return (
    <ul className={className} aria-label={label}>
      {machines.map(machine => (
        <MachineRow
          key={machine.name}
          machine={machine}
          model={model}
          commands={commands}
          trans={trans}
        />
      ))}
    </ul>
  );
}

/**
 * Whether a machine is the organization's (set in the hub's service), not this user's own.
 */
export function isOrganizations(machine: IMachine): boolean {
  return machine.owner === 'organization';
}

/**
 * The kinds of machine, one line each: what a newcomer picks from.
 */
function EmptyMachines(props: { trans: TranslationBundle }): JSX.Element {
  const { trans } = props;
  const kinds: [string, string][] = [
    [trans.__('SSH host'), trans.__('any machine you can ssh to')],
    [
      trans.__('Jupyter Server'),
      trans.__('a remote Jupyter or JupyterHub you have a token for')
    ],
    [
      trans.__('Slurm cluster'),
      trans.__("jobs wait in the cluster's queue (sbatch over ssh)")
    ],
    [
      trans.__('Agent'),
      trans.__('an on-prem machine that fetches its jobs from here')
    ],
    [
      trans.__('SkyPilot'),
      trans.__('your own cloud accounts: a cluster made for the job')
    ],
    [
      trans.__('This machine'),
      trans.__('already here: jobs run beside this server')
    ]
  ];
  return (
    <div className="jp-RemoteCompute-empty jp-RemoteCompute-emptyMachines">
      <p>{trans.__('No other machine yet. Add one of:')}</p>
      <ul aria-label={trans.__('Kinds of machine')}>
        {kinds.map(([kind, what]) => (
          <li key={kind}>
            <strong>{kind}</strong> — {what}
          </li>
        ))}
      </ul>
    </div>
  );
}

function JobRow(props: {
  job: IJob;
  top: number;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element {
  const { job, top, commands, trans } = props;
  const open = (): void =>
    void commands.execute('remote-compute:show-job', { id: job.id });
  const failed = job.state === 'failed' || job.state === 'lost';
  return (
    <li
      className="jp-RemoteCompute-job"
      style={{ top, height: JOB_ROW_HEIGHT }}
      tabIndex={0}
      aria-label={job.name || job.id}
      data-job-id={job.id}
      data-state={job.state}
      title={job.reason ? `${job.id}\n${job.reason}` : job.id}
      onClick={open}
      onKeyDown={e => {
        if (e.key === 'Enter' || e.key === ' ') {
          e.preventDefault();
          open();
        }
      }}
    >
      <div className="jp-RemoteCompute-jobLine">
        <span className="jp-RemoteCompute-jobName">{job.name || job.id}</span>
        <StateBadge job={job} trans={trans} />
      </div>
      <div className="jp-RemoteCompute-jobLine jp-RemoteCompute-itemDetail">
        <span className="jp-RemoteCompute-jobMeta">
          {job.machine}
          {job.started || job.created ? (
            <>
              {' · '}
              <RelativeTime when={job.started ?? job.created} trans={trans} />
            </>
          ) : null}
          {job.started ? (
            <>
              {' · '}
              <JobDuration job={job} />
            </>
          ) : null}
        </span>
        {/* Why it failed, or why the scheduler keeps it waiting (Slurm's reason in words). */}
        {(failed || job.state === 'pending') && job.reason && (
          <span className="jp-RemoteCompute-jobReason">{job.reason}</span>
        )}
      </div>
    </li>
  );
}

/**
 * The job list, windowed: only the rows in view (plus a few) are rendered.
 */
function JobList(props: {
  jobs: readonly IJob[];
  hasMore: boolean;
  loadMore: () => void;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element {
  const { jobs, hasMore, loadMore, commands, trans } = props;
  // The panel scrolls as one (machines, runs and jobs alike); the rows drawn are those near the
  // part of the list the panel's scroller shows.
  const list = React.useRef<HTMLUListElement>(null);
  const [view, setView] = React.useState({ top: 0, height: 400 });
  React.useEffect(() => {
    const el = list.current;
    const scroller = el?.closest<HTMLElement>(`.${PANEL_SCROLLER}`);
    if (!el || !scroller) {
      return;
    }
    const update = () => {
      const above =
        scroller.getBoundingClientRect().top - el.getBoundingClientRect().top;
      setView({
        top: Math.max(0, above),
        height: scroller.clientHeight || 400
      });
    };
    update();
    scroller.addEventListener('scroll', update, { passive: true });
    const observer = new ResizeObserver(update);
    observer.observe(scroller);
    return () => {
      scroller.removeEventListener('scroll', update);
      observer.disconnect();
    };
  }, []);
  const overscan = 5;
  const first = Math.max(0, Math.floor(view.top / JOB_ROW_HEIGHT) - overscan);
  const last = Math.min(
    jobs.length,
    Math.ceil((view.top + view.height) / JOB_ROW_HEIGHT) + overscan
  );
  const visible = jobs.slice(first, last);
  // Ask for the next page while a page's worth of rows is still below the fold.
  const nearEnd = last + PREFETCH_ROWS >= jobs.length;
  React.useEffect(() => {
    if (hasMore && nearEnd) {
      loadMore();
    }
  }, [hasMore, nearEnd, jobs.length]);
  return (
    <div className="jp-RemoteCompute-jobScroller">
      <ul
        ref={list}
        className="jp-RemoteCompute-jobList"
        aria-label={trans.__('Jobs')}
        aria-rowcount={jobs.length}
        style={{ height: jobs.length * JOB_ROW_HEIGHT }}
      >
        {visible.map((job, i) => (
          <JobRow
            key={job.id}
            job={job}
            top={(first + i) * JOB_ROW_HEIGHT}
            commands={commands}
            trans={trans}
          />
        ))}
      </ul>
    </div>
  );
}

function Jobs(props: {
  model: ComputeModel;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element {
  const { model, commands, trans } = props;
  const { machine, state } = model.filter;
  // The search box shows what is typed at once; the server is asked once typing pauses.
  const [name, setName] = React.useState(model.filter.name);
  React.useEffect(() => {
    const timer = window.setTimeout(
      () => void model.setFilter({ name }),
      SEARCH_DELAY
    );
    return () => window.clearTimeout(timer);
  }, [name]);
  const machineNames = React.useMemo(() => {
    const names = new Set<string>(model.machines.map(m => m.name));
    for (const job of model.jobs) {
      names.add(job.machine);
    }
    if (machine) {
      names.add(machine);
    }
    return [...names].sort();
  }, [model.machines, model.jobs, machine]);
  const jobs = model.jobs;
  const filtered = !!(machine || state || model.filter.name);
  return (
    <section
      className="jp-RemoteCompute-jobs"
      aria-labelledby="jp-RemoteCompute-jobs-heading"
    >
      <div className="jp-RemoteCompute-sectionHeader">
        <h3
          id="jp-RemoteCompute-jobs-heading"
          className="jp-RemoteCompute-sectionTitle"
        >
          {trans.__('Jobs')}
          {jobs.length > 0 && (
            <span
              className="jp-RemoteCompute-count"
              title={
                model.hasMore
                  ? trans.__('%1 loaded; more load as you scroll', jobs.length)
                  : ''
              }
            >
              {` (${jobs.length}${model.hasMore ? '+' : ''})`}
            </span>
          )}
        </h3>
        <ToolbarButtonComponent
          icon={runIcon}
          label={trans.__('New job')}
          tooltip={trans.__('Start a job on one of the machines')}
          onClick={() => void commands.execute('remote-compute:run')}
        />
        <ToolbarButtonComponent
          icon={clearIcon}
          tooltip={trans.__('Forget old finished jobs…')}
          onClick={() => void commands.execute('remote-compute:prune-jobs')}
        />
      </div>
      <div className="jp-RemoteCompute-filters">
        <select
          className="jp-mod-styled"
          aria-label={trans.__('Filter jobs by machine')}
          value={machine}
          onChange={e => void model.setFilter({ machine: e.target.value })}
        >
          <option value="">{trans.__('All machines')}</option>
          {machineNames.map(name => (
            <option key={name} value={name}>
              {name === 'local' ? trans.__('This machine') : name}
            </option>
          ))}
        </select>
        <select
          className="jp-mod-styled"
          aria-label={trans.__('Filter jobs by state')}
          value={state}
          onChange={e => void model.setFilter({ state: e.target.value })}
        >
          <option value="">{trans.__('All states')}</option>
          <option value="active">{trans.__('Active (not finished)')}</option>
          {ALL_STATES.map(s => (
            <option key={s} value={s}>
              {stateLabel(s, trans)}
            </option>
          ))}
        </select>
        <input
          type="search"
          className="jp-mod-styled jp-RemoteCompute-search"
          aria-label={trans.__('Search jobs by name')}
          placeholder={trans.__('Search by name')}
          value={name}
          onChange={e => setName(e.target.value)}
        />
      </div>
      {jobs.length === 0 ? (
        <p className="jp-RemoteCompute-empty">
          {filtered
            ? trans.__('No job matches the filters.')
            : trans.__('No jobs yet.')}
        </p>
      ) : (
        <JobList
          jobs={jobs}
          hasMore={model.hasMore}
          loadMore={() => void model.loadMore()}
          commands={commands}
          trans={trans}
        />
      )}
    </section>
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
        {runs && (
          <PipelineRunList runs={runs} commands={commands} trans={trans} />
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
