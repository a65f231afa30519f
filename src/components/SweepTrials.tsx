/**
 * A sweep's trials in the Compute panel: one row per trial (its state, machine, parameters and the
 * sweep's metric), sortable by any column, the best trial marked; a chart of the metric against a
 * parameter; MLflow's comparison of the trials' runs; and the whole sweep cancelled in one click.
 *
 * The rows follow the run's events: each trial's state, and its metric's latest value as the server
 * reads it from the trials' machines (`sweep.latest`).
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { CommandRegistry } from '@lumino/commands';
import * as React from 'react';

import { IJob, IPipelineRun } from '../api';
import { LineChart, ILinePoint, formatNumber } from './charts/LineChart';
import { stateLabel } from './common';

type Sweep = NonNullable<IPipelineRun['sweep']>;

interface ITrialRow {
  id: string;
  state: string;
  reason: string | null;
  jobId: string | null;
  machine: string;
  parameters: Record<string, string>;
  value: number | null;
  mlflowRunId: string | null;
}

/**
 * Sort key: a column's text, numbers as numbers (a grid's values are strings: 0.01 before 0.1).
 */
function cell(row: ITrialRow, column: string): string | number | null {
  switch (column) {
    case 'trial':
      return Number(row.id.replace(/^trial-/, ''));
    case 'state':
      return row.state;
    case 'machine':
      return row.machine;
    case 'metric':
      return row.value;
    default: {
      const text = row.parameters[column] ?? '';
      const number = Number(text);
      return text !== '' && Number.isFinite(number) ? number : text;
    }
  }
}

export function compareRows(
  a: ITrialRow,
  b: ITrialRow,
  column: string,
  ascending: boolean
): number {
  const x = cell(a, column);
  const y = cell(b, column);
  // Trials without a value sort last either way.
  if (x === null || y === null) {
    return x === y ? 0 : x === null ? 1 : -1;
  }
  const order = x < y ? -1 : x > y ? 1 : 0;
  return ascending ? order : -order;
}

/**
 * The trial with the best metric value, by the sweep's goal.
 */
export function bestTrial(
  rows: readonly ITrialRow[],
  goal: string | null
): string | null {
  let best: ITrialRow | null = null;
  for (const row of rows) {
    if (row.value === null) {
      continue;
    }
    if (
      best === null ||
      (goal === 'max' ? row.value > best.value! : row.value < best.value!)
    ) {
      best = row;
    }
  }
  return best?.id ?? null;
}

function trialRows(
  run: IPipelineRun,
  sweep: Sweep,
  jobOf: (id: string) => IJob | undefined
): ITrialRow[] {
  return Object.entries(run.nodes).map(([id, node]) => {
    const job = node.job_id ? jobOf(node.job_id) : undefined;
    const latest = sweep.latest?.[id];
    return {
      id,
      state: node.state,
      reason: node.reason ?? null,
      jobId: node.job_id ?? null,
      machine: job?.machine ?? '',
      parameters: sweep.parameters[id] ?? {},
      value: latest ? latest[1] : null,
      mlflowRunId: job?.mlflow_run_id ?? null
    };
  });
}

export function SweepTrials(props: {
  run: IPipelineRun;
  jobOf: (id: string) => IJob | undefined;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element | null {
  const { run, jobOf, commands, trans } = props;
  const sweep = run.sweep;
  const [sortBy, setSortBy] = React.useState('trial');
  const [ascending, setAscending] = React.useState(true);
  const names = sweep
    ? Object.keys(Object.values(sweep.parameters)[0] ?? {})
    : [];
  const [chartBy, setChartBy] = React.useState(names[0] ?? '');
  if (!sweep) {
    return null;
  }
  const rows = trialRows(run, sweep, jobOf);
  const best = bestTrial(rows, sweep.goal ?? null);
  const sorted = [...rows].sort((a, b) => compareRows(a, b, sortBy, ascending));
  const sortOn = (column: string): void => {
    setAscending(column === sortBy ? !ascending : true);
    setSortBy(column);
  };
  const columns: [string, string][] = [
    ['trial', trans.__('Trial')],
    ['state', trans.__('State')],
    ['machine', trans.__('Machine')],
    ...names.map(name => [name, name] as [string, string]),
    ...(sweep.metric ? [['metric', sweep.metric] as [string, string]] : [])
  ];
  const runIds = rows
    .map(r => r.mlflowRunId)
    .filter((id): id is string => !!id);
  const points: ILinePoint[] = rows
    .filter(
      r => r.value !== null && Number.isFinite(Number(r.parameters[chartBy]))
    )
    .map(r => ({ x: Number(r.parameters[chartBy]), y: r.value }));
  const bestRow = rows.find(r => r.id === best);
  const highlight = points.find(
    p =>
      bestRow &&
      p.x === Number(bestRow.parameters[chartBy]) &&
      p.y === bestRow.value
  );

  return (
    <div
      className="jp-RemoteCompute-sweep"
      aria-label={trans.__('Trials of sweep %1', sweep.name)}
    >
      <table className="jp-RemoteCompute-sweepTable">
        <thead>
          <tr>
            {columns.map(([column, label]) => (
              <th
                key={column}
                scope="col"
                aria-sort={
                  column === sortBy
                    ? ascending
                      ? 'ascending'
                      : 'descending'
                    : 'none'
                }
              >
                <button
                  type="button"
                  className="jp-RemoteCompute-sortButton"
                  onClick={() => sortOn(column)}
                  title={trans.__('Sort by %1', label)}
                >
                  {label}
                </button>
              </th>
            ))}
          </tr>
        </thead>
        <tbody>
          {sorted.map(row => (
            <tr
              key={row.id}
              className="jp-RemoteCompute-sweepTrial"
              data-trial={row.id}
              data-best={row.id === best ? 'true' : 'false'}
              title={row.reason ?? undefined}
            >
              <td>
                {row.jobId ? (
                  <button
                    type="button"
                    className="jp-RemoteCompute-linkButton"
                    aria-label={trans.__(
                      'Show job %1 of %2',
                      row.jobId,
                      row.id
                    )}
                    onClick={() =>
                      void commands.execute('remote-compute:show-job', {
                        id: row.jobId!
                      })
                    }
                  >
                    {row.id.replace(/^trial-/, '')}
                  </button>
                ) : (
                  row.id.replace(/^trial-/, '')
                )}
                {row.id === best && (
                  <span
                    className="jp-RemoteCompute-best"
                    aria-label={trans.__('best')}
                  >
                    {' ★'}
                  </span>
                )}
              </td>
              <td>
                <span className="jp-RemoteCompute-state" data-state={row.state}>
                  {stateLabel(row.state, trans)}
                </span>
              </td>
              <td className="jp-RemoteCompute-sweepMachine">{row.machine}</td>
              {names.map(name => (
                <td key={name}>{row.parameters[name]}</td>
              ))}
              {sweep.metric && (
                <td className="jp-RemoteCompute-sweepMetric">
                  {row.value === null ? '–' : formatNumber(row.value)}
                </td>
              )}
            </tr>
          ))}
        </tbody>
      </table>
      {sweep.metric && names.length > 0 && (
        <div className="jp-RemoteCompute-sweepChart">
          {names.length > 1 && (
            <label>
              {trans.__('%1 against', sweep.metric)}{' '}
              <select
                value={chartBy}
                onChange={e => setChartBy(e.target.value)}
              >
                {names.map(name => (
                  <option key={name} value={name}>
                    {name}
                  </option>
                ))}
              </select>
            </label>
          )}
          <LineChart
            title={trans.__('%1 against %2', sweep.metric, chartBy)}
            points={points}
            xLabel={chartBy}
            dots
            highlight={highlight ?? null}
          />
        </div>
      )}
      <div className="jp-RemoteCompute-sweepActions">
        <button
          type="button"
          className="jp-mod-styled"
          disabled={runIds.length < 2}
          title={
            runIds.length < 2
              ? trans.__('Once two trials have their MLflow runs')
              : trans.__("Compare the trials' %1 MLflow runs", runIds.length)
          }
          onClick={() =>
            void commands.execute('remote-compute:open-mlflow', {
              compareRunIds: runIds,
              pipelineRunId: run.id,
              label: trans.__('sweep %1', sweep.name)
            })
          }
        >
          {trans.__('Compare in MLflow')}
        </button>
        <button
          type="button"
          className="jp-mod-styled jp-mod-warn"
          disabled={run.state !== 'running'}
          onClick={() =>
            void commands.execute('remote-compute:cancel-pipeline', {
              id: run.id
            })
          }
        >
          {trans.__('Cancel Sweep')}
        </button>
      </div>
    </div>
  );
}
