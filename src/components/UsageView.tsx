/**
 * The Usage view (main area): job-hours and GPU-hours per machine per month as a bar chart,
 * and every figure of each machine and month in a table, with the CSV the server makes. For an
 * organization's admin, the same per user and month, of every user of the organization's machines.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import {
  downloadIcon,
  ReactWidget,
  refreshIcon,
  ToolbarButtonComponent
} from '@jupyterlab/ui-components';
import * as React from 'react';

import {
  getOrgUsage,
  getUsage,
  IUsage,
  IUsageQuery,
  IUsageRow,
  usageCsvUrl
} from '../api';
import { formatSize } from '../format';
import { computeIcon } from '../icons';
import { asAPIError } from '../model';
import { BarChart } from './charts/BarChart';

const GROUP_BY: IUsageQuery['group_by'] = ['machine', 'month'];
const ORG_GROUP_BY = ['user', 'month'];

function hours(value: number): string {
  if (value === 0) {
    return '0 h';
  }
  return value < 10 ? `${value.toFixed(2)} h` : `${value.toFixed(1)} h`;
}

/**
 * An axis tick in hours: as many digits as ticks apart need (0.005 h, 0.01 h, 0.015 h), where two
 * decimals read "0.01 h" three times.
 */
function tickHours(value: number): string {
  return value === 0 ? '0 h' : `${Number(value.toPrecision(3))} h`;
}

/**
 * A machine as the table names it: the built-in one is "This machine".
 */
function machineName(row: IUsageRow, trans: TranslationBundle): string {
  return row.machine === 'local'
    ? trans.__('This machine')
    : (row.machine ?? '');
}

/**
 * Whom or what a row is of: the machine (this workspace's usage) or the user (the organization's).
 */
function subjectOf(
  row: IUsageRow,
  perUser: boolean,
  trans: TranslationBundle
): string {
  return perUser ? (row.user ?? '') : machineName(row, trans);
}

/**
 * "gpu-box · 2026-11": one chart category per machine (or user) and month, by month then name.
 */
function categoryOf(row: IUsageRow): string {
  return `${row.user ?? row.machine ?? ''} · ${row.month ?? ''}`;
}

function sortedRows(usage: IUsage): IUsageRow[] {
  return [...usage.rows].sort(
    (a, b) =>
      (a.month ?? '').localeCompare(b.month ?? '') ||
      (a.user ?? a.machine ?? '').localeCompare(b.user ?? b.machine ?? '')
  );
}

function UsageTable(props: {
  rows: IUsageRow[];
  perUser: boolean;
  trans: TranslationBundle;
}): JSX.Element {
  const { rows, perUser, trans } = props;
  return (
    <table
      className="jp-RemoteCompute-usageTable"
      aria-label={
        perUser
          ? trans.__('Usage per user and month')
          : trans.__('Usage per machine and month')
      }
    >
      <thead>
        <tr>
          <th scope="col">
            {perUser ? trans.__('User') : trans.__('Machine')}
          </th>
          <th scope="col">{trans.__('Month')}</th>
          <th scope="col">{trans.__('Attempts')}</th>
          <th scope="col">{trans.__('Job-hours')}</th>
          <th scope="col">{trans.__('Node-hours')}</th>
          <th scope="col">{trans.__('GPU-hours')}</th>
          <th scope="col">{trans.__('Queued')}</th>
          <th scope="col">{trans.__('Sent')}</th>
          <th scope="col">{trans.__('Fetched')}</th>
          <th scope="col">{trans.__('Cost (estimate)')}</th>
        </tr>
      </thead>
      <tbody>
        {rows.map(row => (
          <tr key={categoryOf(row)}>
            <td>{subjectOf(row, perUser, trans)}</td>
            <td>{row.month}</td>
            <td>
              {row.attempts}
              {row.running > 0 && (
                <span className="jp-RemoteCompute-usageNote">
                  {' '}
                  {trans.__('(%1 running, counted up to now)', row.running)}
                </span>
              )}
              {row.estimated_attempts > 0 && (
                <span
                  className="jp-RemoteCompute-usageNote"
                  title={trans.__(
                    'Lost attempts: their end is when this side noticed'
                  )}
                >
                  {' '}
                  {trans.__('(%1 estimated)', row.estimated_attempts)}
                </span>
              )}
            </td>
            <td>{hours(row.job_hours)}</td>
            <td>{hours(row.node_hours)}</td>
            <td>{hours(row.gpu_hours)}</td>
            <td>{hours(row.queue_hours)}</td>
            <td>{formatSize(row.bytes_sent)}</td>
            <td>{formatSize(row.bytes_fetched)}</td>
            <td>
              {row.cost_estimate === null
                ? '—'
                : trans.__('~%1', row.cost_estimate.toFixed(2))}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

function UsageComponent(props: {
  trans: TranslationBundle;
  organization: boolean;
}): JSX.Element {
  const { trans, organization } = props;
  const [usage, setUsage] = React.useState<IUsage | null>(null);
  const [error, setError] = React.useState<string | null>(null);
  const [loading, setLoading] = React.useState(true);

  const load = React.useCallback(async () => {
    setLoading(true);
    try {
      setUsage(
        await (organization
          ? getOrgUsage(ORG_GROUP_BY)
          : getUsage({ group_by: GROUP_BY }))
      );
      setError(null);
    } catch (e) {
      setError(asAPIError(e).message);
    } finally {
      setLoading(false);
    }
  }, []);
  React.useEffect(() => {
    void load();
  }, [load]);

  const rows = usage ? sortedRows(usage) : [];
  return (
    <div className="jp-RemoteCompute-usage">
      <div className="jp-RemoteCompute-sectionHeader">
        <h2 className="jp-RemoteCompute-title">
          {organization
            ? trans.__("Usage of the organization's machines, per user")
            : trans.__('Usage')}
        </h2>
        <ToolbarButtonComponent
          icon={refreshIcon}
          tooltip={trans.__('Sum the usage again')}
          onClick={() => void load()}
        />
        {!organization && (
          <a
            className="jp-RemoteCompute-usageCsv"
            href={usageCsvUrl({ group_by: GROUP_BY })}
            download="usage.csv"
            title={trans.__('Download these sums as CSV')}
          >
            <downloadIcon.react tag="span" />
            {trans.__('CSV')}
          </a>
        )}
      </div>
      {error && (
        <p className="jp-RemoteCompute-error" role="alert">
          {trans.__('Could not load the usage: %1', error)}
        </p>
      )}
      {!error && loading && !usage && (
        <p className="jp-RemoteCompute-empty">{trans.__('Loading…')}</p>
      )}
      {usage && rows.length === 0 && (
        <p className="jp-RemoteCompute-empty">
          {trans.__('No job has used a machine yet.')}
        </p>
      )}
      {usage && rows.length > 0 && (
        <>
          <div className="jp-RemoteCompute-chartScroller">
            <BarChart
              label={
                organization
                  ? trans.__('Job-hours and GPU-hours per user per month')
                  : trans.__('Job-hours and GPU-hours per machine per month')
              }
              categories={rows.map(
                row =>
                  `${subjectOf(row, organization, trans)} · ${row.month ?? ''}`
              )}
              series={[
                {
                  name: trans.__('Job-hours'),
                  values: rows.map(r => r.job_hours),
                  color: 'var(--jp-brand-color1)'
                },
                {
                  name: trans.__('GPU-hours (allocated)'),
                  values: rows.map(r => r.gpu_hours),
                  color: 'var(--jp-warn-color1)'
                }
              ]}
              format={hours}
              tickFormat={tickHours}
            />
          </div>
          <UsageTable rows={rows} perUser={organization} trans={trans} />
          <p className="jp-RemoteCompute-usageNote">
            {trans.__(
              'Job-hours are wall time; node-hours count every node a job held (wall time × nodes); GPU-hours are allocated (wall time × GPUs held, on every node). Costs are estimates from each machine’s price_per_hour, where one is set. An attempt counts in the month it ended.'
            )}
          </p>
        </>
      )}
    </div>
  );
}

/**
 * The Usage view as a main-area widget.
 */
export class UsageWidget extends ReactWidget {
  constructor(options: {
    trans: TranslationBundle;
    /**
     * Every user's usage of the organization's machines (an admin's view), not this workspace's.
     */
    organization?: boolean;
  }) {
    super();
    this._trans = options.trans;
    this._organization = !!options.organization;
    this.addClass('jp-RemoteCompute-usageWidget');
    this.title.icon = computeIcon;
    this.title.closable = true;
    this.title.label = this._organization
      ? this._trans.__('Organization usage')
      : this._trans.__('Compute usage');
  }

  render(): JSX.Element {
    return (
      <UsageComponent trans={this._trans} organization={this._organization} />
    );
  }

  private _organization: boolean;
  private _trans: TranslationBundle;
}
