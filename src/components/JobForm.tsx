/**
 * The "New job" form, in the main area: machine, command, files to send (globs), files to
 * bring back, optional name and timeout. "Run again" and the file browser's
 * "Run on a machine…" open it filled in.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { Button, ReactWidget, runIcon } from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';
import * as React from 'react';

import { APIError, IJob, IJobSpec, submitJob } from '../api';
import { splitList } from '../format';
import { asAPIError, ComputeModel } from '../model';
import { Field, useSignal } from './common';

type Values = {
  machine: string;
  command: string;
  send: string;
  bringBack: string;
  name: string;
  timeout: string;
};

function fromSpec(spec: IJobSpec | undefined): Values {
  const command = spec?.command;
  return {
    machine: spec?.machine ?? 'local',
    command: Array.isArray(command) ? command.join(' ') : (command ?? ''),
    send: (spec?.send ?? []).join('\n'),
    bringBack: (spec?.bring_back ?? []).join('\n'),
    name: spec?.name ?? '',
    timeout:
      spec?.timeout === null || spec?.timeout === undefined
        ? ''
        : String(spec.timeout)
  };
}

/**
 * The form field a server error belongs to (`send[0]` → send, `env.TOKEN` → env, …).
 */
function fieldOf(field: string | null): keyof Values | 'env' | null {
  if (!field) {
    return null;
  }
  const head = field.split(/[.[]/)[0];
  switch (head) {
    case 'machine':
    case 'command':
    case 'send':
    case 'name':
    case 'timeout':
      return head;
    case 'bring_back':
      return 'bringBack';
    case 'env':
      return 'env';
    default:
      return null;
  }
}

function JobForm(props: {
  model: ComputeModel;
  trans: TranslationBundle;
  commands: CommandRegistry;
  spec?: IJobSpec;
  keptEnv?: boolean;
}): JSX.Element {
  const { model, trans, commands } = props;
  useSignal(model.changed);
  const [values, setValues] = React.useState<Values>(() =>
    fromSpec(props.spec)
  );
  const [errors, setErrors] = React.useState<Record<string, string>>({});
  const [formError, setFormError] = React.useState<APIError | null>(null);
  const [busy, setBusy] = React.useState(false);
  const [submitted, setSubmitted] = React.useState<{
    job: IJob;
    attached: boolean;
  } | null>(null);

  const env = props.spec?.env ?? {};
  const envNames = Object.keys(env);
  const machines = model.machines.filter(
    m => m.enabled || m.name === values.machine
  );

  const set = (patch: Partial<Values>): void => {
    setValues(v => ({ ...v, ...patch }));
    const cleared = { ...errors };
    for (const key of Object.keys(patch)) {
      delete cleared[key];
    }
    setErrors(cleared);
  };

  const submit = async (): Promise<void> => {
    if (!values.command.trim()) {
      setErrors({ command: trans.__('A command is required.') });
      return;
    }
    const spec: IJobSpec = {
      machine: values.machine,
      command: values.command.trim(),
      send: splitList(values.send),
      bring_back: splitList(values.bringBack)
    };
    if (values.name.trim()) {
      spec.name = values.name.trim();
    }
    if (values.timeout.trim()) {
      const n = Number(values.timeout.trim());
      spec.timeout = Number.isFinite(n) ? n : values.timeout.trim();
    }
    if (envNames.length > 0) {
      // Carried over from the job this one repeats; never shown.
      spec.env = env;
    }
    setBusy(true);
    setFormError(null);
    setSubmitted(null);
    try {
      const result = await submitJob(spec);
      model.upsertJob(result.job);
      setSubmitted(result);
      void commands.execute('remote-compute:show-job', { id: result.job.id });
    } catch (error) {
      const apiError = asAPIError(error);
      const field = fieldOf(apiError.field);
      if (field && field !== 'env') {
        setErrors({ [field]: apiError.message });
      } else {
        setFormError(apiError);
      }
    } finally {
      setBusy(false);
    }
  };

  const prefix = 'jp-RemoteCompute-job';
  return (
    <form
      className="jp-RemoteCompute-form"
      aria-label={trans.__('New job')}
      onSubmit={e => {
        e.preventDefault();
        void submit();
      }}
    >
      <h2 className="jp-RemoteCompute-formTitle">{trans.__('New job')}</h2>
      {formError && (
        <div className="jp-RemoteCompute-banner" role="alert">
          {formError.message}
        </div>
      )}
      <Field
        id={`${prefix}-machine`}
        label={trans.__('Machine')}
        error={errors.machine}
      >
        {aria => (
          <select
            {...aria}
            className="jp-mod-styled"
            value={values.machine}
            onChange={e => set({ machine: e.target.value })}
          >
            {machines.length === 0 && (
              <option value="local">{trans.__('This machine')}</option>
            )}
            {machines.map(m => (
              <option key={m.name} value={m.name}>
                {m.builtin ? trans.__('This machine') : `${m.name} (${m.kind})`}
                {m.enabled ? '' : ` — ${trans.__('disabled')}`}
              </option>
            ))}
          </select>
        )}
      </Field>
      <Field
        id={`${prefix}-command`}
        label={trans.__('Command')}
        help={trans.__(
          'Runs in the job folder on the machine, e.g. python train.py --epochs 3'
        )}
        error={errors.command}
      >
        {aria => (
          <input
            {...aria}
            className="jp-mod-styled jp-RemoteCompute-code"
            type="text"
            value={values.command}
            autoComplete="off"
            spellCheck={false}
            onChange={e => set({ command: e.target.value })}
          />
        )}
      </Field>
      <Field
        id={`${prefix}-send`}
        label={trans.__('Files to send')}
        help={trans.__(
          'Workspace-relative files, folders or globs (data/*.csv), one per line.'
        )}
        error={errors.send}
      >
        {aria => (
          <textarea
            {...aria}
            className="jp-mod-styled jp-RemoteCompute-code"
            rows={3}
            value={values.send}
            spellCheck={false}
            onChange={e => set({ send: e.target.value })}
          />
        )}
      </Field>
      <Field
        id={`${prefix}-bring-back`}
        label={trans.__('Files to bring back')}
        help={trans.__(
          'What the command writes and you want in the workspace (model.pt), one per line.'
        )}
        error={errors.bringBack}
      >
        {aria => (
          <textarea
            {...aria}
            className="jp-mod-styled jp-RemoteCompute-code"
            rows={2}
            value={values.bringBack}
            spellCheck={false}
            onChange={e => set({ bringBack: e.target.value })}
          />
        )}
      </Field>
      <Field
        id={`${prefix}-name`}
        label={trans.__('Name (optional)')}
        error={errors.name}
      >
        {aria => (
          <input
            {...aria}
            className="jp-mod-styled"
            type="text"
            value={values.name}
            autoComplete="off"
            onChange={e => set({ name: e.target.value })}
          />
        )}
      </Field>
      <Field
        id={`${prefix}-timeout`}
        label={trans.__('Timeout (optional)')}
        help={trans.__('Seconds, or e.g. 30m, 2h.')}
        error={errors.timeout}
      >
        {aria => (
          <input
            {...aria}
            className="jp-mod-styled"
            type="text"
            value={values.timeout}
            autoComplete="off"
            onChange={e => set({ timeout: e.target.value })}
          />
        )}
      </Field>
      {envNames.length > 0 && (
        <p className="jp-RemoteCompute-fieldHelp">
          {trans.__(
            'Environment kept from the original job: %1',
            envNames.join(', ')
          )}
        </p>
      )}
      <div className="jp-RemoteCompute-formButtons">
        <Button type="submit" disabled={busy} className="jp-mod-accept">
          {trans.__('Run')}
        </Button>
        {busy && (
          <span className="jp-RemoteCompute-busy">
            {trans.__('Submitting…')}
          </span>
        )}
      </div>
      {submitted && (
        <div className="jp-RemoteCompute-submitted" role="status">
          <span>
            {submitted.attached
              ? trans.__(
                  'Attached to running job %1: the same work is already under way, nothing new was started.',
                  submitted.job.name || submitted.job.id
                )
              : trans.__(
                  'Started job %1.',
                  submitted.job.name || submitted.job.id
                )}
          </span>
          <Button
            type="button"
            minimal
            onClick={() =>
              void commands.execute('remote-compute:show-job', {
                id: submitted.job.id
              })
            }
          >
            {trans.__('Show job')}
          </Button>
        </div>
      )}
    </form>
  );
}

export class JobFormWidget extends ReactWidget {
  constructor(options: JobFormWidget.IOptions) {
    super();
    this._options = options;
    this.addClass('jp-RemoteCompute-formWidget');
    this.title.label = options.trans.__('New job');
    this.title.icon = runIcon;
    this.title.closable = true;
  }

  render(): JSX.Element {
    const { model, trans, commands, spec, keptEnv } = this._options;
    return (
      <JobForm
        model={model}
        trans={trans}
        commands={commands}
        spec={spec}
        keptEnv={keptEnv}
      />
    );
  }

  private _options: JobFormWidget.IOptions;
}

export namespace JobFormWidget {
  export interface IOptions {
    model: ComputeModel;
    trans: TranslationBundle;
    commands: CommandRegistry;
    spec?: IJobSpec;
    keptEnv?: boolean;
  }
}
