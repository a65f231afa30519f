/**
 * The panel's Organization section, for a user with the organization service's admin scope: add one
 * of its machines (the machine form, through the service), its default machine, its MLflow tracking
 * server, its quotas (list, set,
 * remove), every user's usage per month, and every job on its machines with its user. Everyone else
 * never sees it; the service refuses them all the same.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import {
  addIcon,
  Button,
  deleteIcon,
  refreshIcon,
  tableRowsIcon,
  ToolbarButtonComponent
} from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';
import * as React from 'react';

import {
  clearOrgDefaultMachine,
  clearOrgTracking,
  deleteQuota,
  getOrgTracking,
  IOrgJob,
  IQuota,
  IQuotaInput,
  listOrgJobs,
  listQuotas,
  QuotaHolder,
  setOrgDefaultMachine,
  setOrgTracking,
  setQuota
} from '../api';
import { asAPIError, ComputeModel } from '../model';
import { Field, RelativeTime } from './common';
import { isOrganizations } from './MachineList';
import { Secrets } from './Secrets';

/**
 * The newest jobs shown; the rest are counted.
 */
const JOBS_SHOWN = 50;

type Limit = 'gpu_hours' | 'job_hours' | 'jobs';
const LIMITS: Limit[] = ['gpu_hours', 'job_hours', 'jobs'];

function limitLabel(limit: Limit, trans: TranslationBundle): string {
  switch (limit) {
    case 'gpu_hours':
      return trans.__('GPU-hours');
    case 'job_hours':
      return trans.__('Job-hours');
    case 'jobs':
      return trans.__('Jobs at once');
  }
}

/**
 * "1.25 / 10" for hours, "1 / 2" for jobs; nothing where the quota sets no such limit.
 */
function usedOf(quota: IQuota, limit: Limit): string {
  const allowed = quota[limit];
  if (allowed === undefined || allowed === null) {
    return '—';
  }
  const used = quota.used[limit] ?? 0;
  return limit === 'jobs'
    ? `${Math.round(used)} / ${allowed}`
    : `${used.toFixed(2)} / ${allowed}`;
}

function holderOf(quota: IQuota): [QuotaHolder, string] {
  const [who, ...rest] = quota.who.split(':');
  return [who === 'group' ? 'group' : 'user', rest.join(':')];
}

function QuotaTable(props: {
  quotas: IQuota[];
  onRemove: (quota: IQuota) => void;
  trans: TranslationBundle;
}): JSX.Element {
  const { quotas, onRemove, trans } = props;
  return (
    <table
      className="jp-RemoteCompute-orgTable"
      aria-label={trans.__('Quotas')}
    >
      <thead>
        <tr>
          <th scope="col">{trans.__('Who')}</th>
          {LIMITS.map(limit => (
            <th key={limit} scope="col">
              {limitLabel(limit, trans)}
            </th>
          ))}
          <th scope="col">
            <span className="jp-RemoteCompute-visuallyHidden">
              {trans.__('Actions')}
            </span>
          </th>
        </tr>
      </thead>
      <tbody>
        {quotas.map(quota => {
          const [holder, name] = holderOf(quota);
          return (
            <tr key={quota.who} aria-label={quota.who}>
              <td
                title={
                  quota.soft
                    ? trans.__('Soft: a notice only, per %1', quota.period)
                    : trans.__(
                        'Hard: a job is stopped %1 s after it is used up, per %2',
                        quota.grace_seconds,
                        quota.period
                      )
                }
              >
                {holder === 'group'
                  ? trans.__('group %1', name)
                  : trans.__('user %1', name)}
                {quota.soft && (
                  <span className="jp-RemoteCompute-itemDetail">
                    {' · ' + trans.__('soft')}
                  </span>
                )}
              </td>
              {LIMITS.map(limit => (
                <td key={limit}>{usedOf(quota, limit)}</td>
              ))}
              <td>
                <ToolbarButtonComponent
                  icon={deleteIcon}
                  tooltip={trans.__('Remove the quota of %1', quota.who)}
                  onClick={() => onRemove(quota)}
                />
              </td>
            </tr>
          );
        })}
      </tbody>
    </table>
  );
}

/**
 * Set (or replace) a user's or group's quota per month.
 */
function QuotaForm(props: {
  onSet: () => void;
  trans: TranslationBundle;
}): JSX.Element {
  const { onSet, trans } = props;
  const [holder, setHolder] = React.useState<QuotaHolder>('user');
  const [name, setName] = React.useState('');
  const [limits, setLimits] = React.useState<Record<Limit, string>>({
    gpu_hours: '',
    job_hours: '',
    jobs: ''
  });
  const [soft, setSoft] = React.useState(false);
  const [error, setError] = React.useState<string | null>(null);
  const [busy, setBusy] = React.useState(false);
  const prefix = 'jp-RemoteCompute-quota';

  const submit = async (): Promise<void> => {
    if (!name.trim()) {
      setError(trans.__('Name a hub user or group.'));
      return;
    }
    const body: IQuotaInput = { period: 'month', soft };
    for (const limit of LIMITS) {
      const text = limits[limit].trim();
      if (!text) {
        continue;
      }
      const value = Number(text);
      if (!Number.isFinite(value) || value < 0) {
        setError(trans.__('%1: expected a number, 0 or more.', limit));
        return;
      }
      body[limit] = limit === 'jobs' ? Math.round(value) : value;
    }
    if (LIMITS.every(limit => body[limit] === undefined)) {
      setError(trans.__('Give GPU-hours, job-hours or jobs at once.'));
      return;
    }
    setBusy(true);
    try {
      await setQuota(holder, name.trim(), body);
      setError(null);
      setName('');
      setLimits({ gpu_hours: '', job_hours: '', jobs: '' });
      onSet();
    } catch (e) {
      setError(asAPIError(e).message);
    } finally {
      setBusy(false);
    }
  };

  return (
    <form
      className="jp-RemoteCompute-quotaForm"
      aria-label={trans.__('Set a quota')}
      onSubmit={e => {
        e.preventDefault();
        void submit();
      }}
    >
      <div className="jp-RemoteCompute-quotaWho">
        <select
          className="jp-mod-styled"
          aria-label={trans.__('User or group')}
          value={holder}
          onChange={e => setHolder(e.target.value as QuotaHolder)}
        >
          <option value="user">{trans.__('User')}</option>
          <option value="group">{trans.__('Group')}</option>
        </select>
        <input
          className="jp-mod-styled"
          aria-label={trans.__('Hub name')}
          placeholder={trans.__('hub name')}
          value={name}
          onChange={e => setName(e.target.value)}
        />
      </div>
      <div className="jp-RemoteCompute-quotaLimits">
        {LIMITS.map(limit => (
          <Field
            key={limit}
            id={`${prefix}-${limit}`}
            label={limitLabel(limit, trans)}
          >
            {aria => (
              <input
                {...aria}
                className="jp-mod-styled"
                type="number"
                min={0}
                step={limit === 'jobs' ? 1 : 'any'}
                value={limits[limit]}
                onChange={e =>
                  setLimits(l => ({ ...l, [limit]: e.target.value }))
                }
              />
            )}
          </Field>
        ))}
      </div>
      <label
        className="jp-RemoteCompute-quotaSoft"
        title={trans.__(
          'A soft quota only gives a notice; a hard one stops a running job once used up'
        )}
      >
        <input
          type="checkbox"
          checked={soft}
          onChange={e => setSoft(e.target.checked)}
        />
        {trans.__('Soft (notice only)')}
      </label>
      {error && (
        <div className="jp-RemoteCompute-fieldError" role="alert">
          {error}
        </div>
      )}
      <Button type="submit" className="jp-mod-accept" disabled={busy}>
        {trans.__('Set quota per month')}
      </Button>
    </form>
  );
}

function OrgJobRow(props: {
  job: IOrgJob;
  trans: TranslationBundle;
}): JSX.Element {
  const { job, trans } = props;
  const state = job.stopped
    ? trans.__('stopped')
    : job.running
      ? trans.__('running')
      : trans.__('ended');
  return (
    <li
      className="jp-RemoteCompute-orgJob"
      aria-label={trans.__('%1 of %2', job.id, job.user)}
      title={job.stopped ?? job.id}
    >
      <div className="jp-RemoteCompute-jobLine">
        <span className="jp-RemoteCompute-jobName">{job.user}</span>
        <span
          className="jp-RemoteCompute-state"
          data-state={
            job.stopped ? 'failed' : job.running ? 'running' : 'succeeded'
          }
        >
          {state}
        </span>
      </div>
      <div className="jp-RemoteCompute-jobLine jp-RemoteCompute-itemDetail">
        <span className="jp-RemoteCompute-jobMeta">
          {job.machine}
          {' · '}
          <RelativeTime when={job.created} trans={trans} />
          {' · '}
          <code>{job.id}</code>
        </span>
      </div>
    </li>
  );
}

/**
 * The organization's default machine: what `local` is without a hub, where a job naming none runs.
 * It is not among the listed machines once named, so the choice adds it back.
 */
function DefaultMachine(props: {
  model: ComputeModel;
  onError: (message: string) => void;
  trans: TranslationBundle;
}): JSX.Element {
  const { model, onError, trans } = props;
  const current = (model.defaultMachine ?? '').replace(/^org:/, '');
  const listed = model.machines.filter(isOrganizations).map(m => m.name);
  const names = [...new Set([...(current ? [current] : []), ...listed])].sort();
  const choose = async (name: string): Promise<void> => {
    try {
      if (name) {
        await setOrgDefaultMachine(name);
      } else {
        await clearOrgDefaultMachine();
      }
    } catch (e) {
      onError(asAPIError(e).message);
    }
    await model.refresh();
  };
  return (
    <div className="jp-RemoteCompute-orgDefault">
      <label htmlFor="jp-RemoteCompute-org-default">
        {trans.__('Default machine')}
      </label>
      <select
        id="jp-RemoteCompute-org-default"
        className="jp-mod-styled"
        value={current}
        title={trans.__(
          'Where a job, a pipeline step or a run that names no machine runs, for every member'
        )}
        onChange={e => void choose(e.target.value)}
      >
        <option value="">
          {trans.__("None: such a job runs in its user's own server")}
        </option>
        {names.map(name => (
          <option key={name} value={name}>
            {name}
          </option>
        ))}
      </select>
    </div>
  );
}

/**
 * The organization's MLflow tracking server: where the runs of every member's jobs on its machines are
 * recorded (empty: each member's own store). Its credentials are never here: each member's server has
 * them in its environment.
 */
function TrackingServer(props: {
  onError: (message: string) => void;
  trans: TranslationBundle;
}): JSX.Element {
  const { onError, trans } = props;
  const [saved, setSaved] = React.useState<string>('');
  const [uri, setUri] = React.useState<string>('');
  const [busy, setBusy] = React.useState(false);
  React.useEffect(() => {
    getOrgTracking()
      .then(tracking => {
        setSaved(tracking.uri ?? '');
        setUri(tracking.uri ?? '');
      })
      .catch(e => onError(asAPIError(e).message));
  }, []);
  const save = async (): Promise<void> => {
    setBusy(true);
    try {
      if (uri.trim()) {
        const tracking = await setOrgTracking(uri.trim());
        setSaved(tracking.uri ?? '');
        setUri(tracking.uri ?? '');
      } else {
        await clearOrgTracking();
        setSaved('');
      }
    } catch (e) {
      onError(asAPIError(e).message);
    } finally {
      setBusy(false);
    }
  };
  return (
    <form
      className="jp-RemoteCompute-orgDefault"
      aria-label={trans.__('Tracking server')}
      onSubmit={e => {
        e.preventDefault();
        void save();
      }}
    >
      <label htmlFor="jp-RemoteCompute-org-tracking">
        {trans.__('Tracking server')}
      </label>
      <input
        id="jp-RemoteCompute-org-tracking"
        className="jp-mod-styled"
        type="url"
        placeholder={trans.__("none: each member's own store")}
        title={trans.__(
          "The MLflow tracking server the runs of jobs on the organization's machines are recorded on; no password in it (members give theirs as MLFLOW_TRACKING_TOKEN)"
        )}
        value={uri}
        onChange={e => setUri(e.target.value)}
      />
      <Button
        type="submit"
        className="jp-mod-accept"
        disabled={busy || uri.trim() === saved}
      >
        {uri.trim() ? trans.__('Save') : trans.__('Clear')}
      </Button>
    </form>
  );
}

export function OrganizationSection(props: {
  model: ComputeModel;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element {
  const { model, commands, trans } = props;
  const [quotas, setQuotas] = React.useState<IQuota[] | null>(null);
  const [jobs, setJobs] = React.useState<IOrgJob[] | null>(null);
  const [error, setError] = React.useState<string | null>(null);

  const load = React.useCallback(async () => {
    try {
      const [q, j] = await Promise.all([listQuotas(), listOrgJobs()]);
      setQuotas(q);
      setJobs(j);
      setError(null);
    } catch (e) {
      setError(asAPIError(e).message);
    }
  }, []);
  React.useEffect(() => {
    void load();
  }, [load]);

  const remove = async (quota: IQuota): Promise<void> => {
    const [holder, name] = holderOf(quota);
    try {
      await deleteQuota(holder, name);
    } catch (e) {
      setError(asAPIError(e).message);
    }
    await load();
  };

  return (
    <section
      className="jp-RemoteCompute-organization"
      aria-labelledby="jp-RemoteCompute-organization-heading"
    >
      <div className="jp-RemoteCompute-sectionHeader">
        <h3
          id="jp-RemoteCompute-organization-heading"
          className="jp-RemoteCompute-sectionTitle"
        >
          {trans.__('Organization')}
        </h3>
        <ToolbarButtonComponent
          icon={addIcon}
          label={trans.__('Add a Machine')}
          tooltip={trans.__(
            "Add a machine every member may run jobs on; its credentials stay with the organization's service"
          )}
          onClick={() =>
            void commands.execute('remote-compute:add-org-machine')
          }
        />
        <ToolbarButtonComponent
          icon={tableRowsIcon}
          label={trans.__('Usage')}
          tooltip={trans.__(
            "Every user's job-hours and GPU-hours on the organization's machines, per month"
          )}
          onClick={() => void commands.execute('remote-compute:show-org-usage')}
        />
        <ToolbarButtonComponent
          icon={refreshIcon}
          tooltip={trans.__('Refresh the quotas and jobs')}
          onClick={() => void load()}
        />
      </div>
      {error && (
        <p className="jp-RemoteCompute-error" role="alert">
          {trans.__('The organization service answered: %1', error)}
        </p>
      )}
      <DefaultMachine model={model} onError={setError} trans={trans} />
      <TrackingServer onError={setError} trans={trans} />
      <Secrets owner="organization" trans={trans} />
      <h4 className="jp-RemoteCompute-subsectionTitle">
        {trans.__('Quotas per month')}
      </h4>
      {quotas && quotas.length === 0 && (
        <p className="jp-RemoteCompute-empty">
          {trans.__('No quota yet: every member may use the machines freely.')}
        </p>
      )}
      {quotas && quotas.length > 0 && (
        <QuotaTable
          quotas={quotas}
          onRemove={quota => void remove(quota)}
          trans={trans}
        />
      )}
      <QuotaForm onSet={() => void load()} trans={trans} />
      <h4 className="jp-RemoteCompute-subsectionTitle">
        {trans.__("Every member's jobs")}
        {jobs && jobs.length > 0 && (
          <span className="jp-RemoteCompute-count">{` (${jobs.length})`}</span>
        )}
      </h4>
      {jobs && jobs.length === 0 && (
        <p className="jp-RemoteCompute-empty">
          {trans.__("No job has run on the organization's machines yet.")}
        </p>
      )}
      {jobs && jobs.length > 0 && (
        <ul
          className="jp-RemoteCompute-list"
          aria-label={trans.__("Every member's jobs")}
        >
          {jobs.slice(0, JOBS_SHOWN).map(job => (
            <OrgJobRow key={`${job.user}/${job.id}`} job={job} trans={trans} />
          ))}
        </ul>
      )}
      {jobs && jobs.length > JOBS_SHOWN && (
        <p className="jp-RemoteCompute-itemDetail">
          {trans.__('The newest %1 shown of %2.', JOBS_SHOWN, jobs.length)}
        </p>
      )}
    </section>
  );
}
