/**
 * The panel's jobs: filters, and the list windowed on the panel's scroller, paged in as it scrolls.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import {
  clearIcon,
  runIcon,
  ToolbarButtonComponent
} from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';
import * as React from 'react';

import { ALL_STATES, IJob } from '../api';
import { ComputeModel } from '../model';
import { JobDuration, RelativeTime, StateBadge, stateLabel } from './common';

/**
 * Height of one job row in pixels (the list is windowed on it; keep in sync with the CSS).
 */
export const JOB_ROW_HEIGHT = 46;

/**
 * The panel's one scroller, which the job list follows.
 */
export const PANEL_SCROLLER = 'jp-RemoteCompute-panelScroller';

/**
 * Rows below the visible ones at which the next page is asked for.
 */
const PREFETCH_ROWS = 50;

/**
 * Milliseconds of no typing before a name search goes to the server.
 */
const SEARCH_DELAY = 300;

export function JobRow(props: {
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
      {/* The machine is cut first, the reason takes what is left: the time always shows whole. */}
      <div className="jp-RemoteCompute-jobLine jp-RemoteCompute-jobFacts jp-RemoteCompute-itemDetail">
        <span className="jp-RemoteCompute-jobMachine" title={job.machine}>
          {job.machine}
        </span>
        {job.started || job.created ? (
          <span className="jp-RemoteCompute-jobTime">
            {' · '}
            <RelativeTime when={job.started ?? job.created} trans={trans} />
            {job.started ? (
              <>
                {' · '}
                <JobDuration job={job} />
              </>
            ) : null}
          </span>
        ) : null}
        {/* Why it failed, or why the scheduler keeps it waiting (Slurm's reason in words). */}
        {(failed || job.state === 'pending') && job.reason && (
          <span className="jp-RemoteCompute-jobReason" data-state={job.state}>
            {job.reason}
          </span>
        )}
      </div>
    </li>
  );
}

/**
 * The job list, windowed: only the rows in view (plus a few) are rendered.
 */
export function JobList(props: {
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

export function Jobs(props: {
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
          label={trans.__('New Job')}
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
