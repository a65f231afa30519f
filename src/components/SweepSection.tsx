/**
 * The New Job form's Sweep section: the same job run once per combination of parameters (or a
 * random sample), each trial a job, as `run --sweep` does. Empty, the form runs one job.
 *
 * Parameters are a line each, `lr = 0.001, 0.01, 0.1` or `lr = loguniform(1e-4, 1e-1)`; the server
 * checks them (`POST /pipelines/sweeps`) and names the parameter at fault.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { ISweepRequest } from '../api';

export interface ISweepSettings {
  parameters: string;
  random: string;
  maxParallel: string;
  metric: string;
  earlyStop: boolean;
}

export const NO_SWEEP: ISweepSettings = {
  parameters: '',
  random: '',
  maxParallel: '4',
  metric: '',
  earlyStop: false
};

const RANGE = /^[a-z]+\s*\(.*\)$/;

/**
 * The parameters as the API takes them: name → its values, or a range as written.
 */
export function parseParameters(text: string): ISweepRequest['parameters'] {
  const parameters: ISweepRequest['parameters'] = {};
  for (const line of text.split('\n')) {
    if (!line.trim()) {
      continue;
    }
    const at = line.indexOf('=');
    // A line without "=" is sent as it is: the server names it and says how to write it.
    const name = (at < 0 ? line : line.slice(0, at)).trim();
    const values = at < 0 ? '' : line.slice(at + 1).trim();
    parameters[name] = RANGE.test(values)
      ? values
      : values.split(',').map(v => v.trim());
  }
  return parameters;
}

/**
 * The sweep's part of the request; null when no parameter is given (one job, not a sweep).
 */
export function sweepRequest(
  settings: ISweepSettings
): Omit<ISweepRequest, 'job'> | null {
  if (!settings.parameters.trim()) {
    return null;
  }
  const random = settings.random.trim();
  const metric = settings.metric.trim();
  return {
    parameters: parseParameters(settings.parameters),
    random: random ? Number(random) : null,
    max_parallel: Number(settings.maxParallel.trim() || '4'),
    metric: metric || null,
    early_stop: settings.earlyStop ? 'median' : null
  };
}

function SmallField(props: {
  label: string;
  value: string;
  placeholder?: string;
  numeric?: boolean;
  onChange: (value: string) => void;
}): JSX.Element {
  return (
    <label className="jp-RemoteCompute-field">
      <span>{props.label}</span>
      <input
        className="jp-mod-styled"
        inputMode={props.numeric ? 'numeric' : undefined}
        value={props.value}
        placeholder={props.placeholder}
        onChange={e => props.onChange(e.target.value)}
      />
    </label>
  );
}

export function SweepSection(props: {
  settings: ISweepSettings;
  onChange: (settings: ISweepSettings) => void;
  error: string | null;
  trans: TranslationBundle;
}): JSX.Element {
  const { settings, onChange, error, trans } = props;
  const id = React.useId();
  const set = (changes: Partial<ISweepSettings>): void =>
    onChange({ ...settings, ...changes });
  return (
    <details
      className="jp-RemoteCompute-sweepSection"
      open={!!settings.parameters}
    >
      <summary>{trans.__('Sweep')}</summary>
      <p className="jp-RemoteCompute-fieldHelp">
        {trans.__(
          "Run the command once per combination of values, each trial a job: {lr} in the command (or a path) is the trial's value, and $lr is set too."
        )}
      </p>
      <div
        className="jp-RemoteCompute-field"
        data-invalid={error ? 'true' : 'false'}
      >
        {/* Its own label, not a wrapping one: the box's text would be part of its name. */}
        <label htmlFor={`${id}-parameters`}>{trans.__('Parameters')}</label>
        <textarea
          id={`${id}-parameters`}
          className="jp-mod-styled"
          rows={3}
          value={settings.parameters}
          placeholder={'lr = 0.001, 0.01, 0.1\ndepth = 3, 5'}
          aria-invalid={error ? 'true' : 'false'}
          onChange={e => set({ parameters: e.target.value })}
        />
      </div>
      {error && (
        <p className="jp-RemoteCompute-fieldError" role="alert">
          {error}
        </p>
      )}
      <div className="jp-RemoteCompute-sweepFields">
        <SmallField
          label={trans.__('Random trials (optional)')}
          value={settings.random}
          placeholder={trans.__('every combination')}
          numeric
          onChange={random => set({ random })}
        />
        <SmallField
          label={trans.__('Trials at once')}
          value={settings.maxParallel}
          numeric
          onChange={maxParallel => set({ maxParallel })}
        />
        <SmallField
          label={trans.__('Metric (optional)')}
          value={settings.metric}
          placeholder={trans.__('loss, or accuracy:max')}
          onChange={metric => set({ metric })}
        />
      </div>
      <label className="jp-RemoteCompute-field jp-RemoteCompute-fieldInline">
        <input
          type="checkbox"
          checked={settings.earlyStop}
          onChange={e => set({ earlyStop: e.target.checked })}
        />
        {trans.__('Stop a trial worse than the median of the others')}
      </label>
    </details>
  );
}
