/**
 * The "New job" form, in the main area: machine, command, files to send (globs), files to
 * bring back, optional name and timeout, resources (GPUs, CPUs, memory, nodes, partition) and
 * environment rows whose value is typed or a stored secret (`secret:NAME`). "Run again" and the
 * file browser's "Run on a machine…" open it filled in.
 *
 * Settings are checked by the server only, so the form shows the server's own message beside
 * the field it names (`resources.cpus`, `env.TOKEN`): the same words as the CLI and the API, a
 * typed value that looks like a secret included.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { Button, ReactWidget, runIcon } from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';
import * as React from 'react';

import {
  APIError,
  getSecrets,
  IJob,
  IEnvironment,
  IJobSpec,
  IMachine,
  IResources,
  submitJob
} from '../api';
import { PickFiles, REQUIREMENTS_FILES } from '../filePicker';
import { shellLine, splitList } from '../format';
import { asAPIError, ComputeModel } from '../model';
import { Field, useSignal } from './common';
import { isOrganizations } from './MachineList';

type Values = {
  machine: string;
  command: string;
  send: string;
  bringBack: string;
  name: string;
  timeout: string;
  gpus: string;
  cpus: string;
  memory: string;
  nodes: string;
  partition: string;
  requirements: string;
  packages: string;
  python: string;
  sameEnv: boolean;
  image: string;
  runtime: string;
  registrySecret: string;
};

const RESOURCE_FIELDS = [
  'gpus',
  'cpus',
  'memory',
  'nodes',
  'partition'
] as const;

/**
 * One environment row; `value` is typed, or `secret:NAME` picked from the stored names.
 */
type EnvRow = { key: number; name: string; value: string };

const SECRET_PREFIX = 'secret:';

function text(value: unknown): string {
  return value === null || value === undefined ? '' : String(value);
}

/**
 * The resources as the server reads them: numbers where it expects counts, text left as typed
 * (the server names the field if it is wrong), empty fields left out.
 */
function resourcesOf(values: Values): IResources | undefined {
  const out: Record<string, string | number> = {};
  for (const field of RESOURCE_FIELDS) {
    const typed = values[field].trim();
    if (!typed) {
      continue;
    }
    const n = Number(typed);
    out[field] =
      field !== 'memory' && field !== 'partition' && Number.isInteger(n)
        ? n
        : typed;
  }
  return Object.keys(out).length ? (out as IResources) : undefined;
}

/**
 * A spec's paths as a list: one path may be given as a string.
 */
function pathList(paths: string | string[] | null | undefined): string[] {
  return typeof paths === 'string' ? [paths] : (paths ?? []);
}

function fromSpec(
  spec: IJobSpec | undefined,
  defaultMachine: string | null
): Values {
  const command = spec?.command;
  return {
    machine: spec?.machine ?? defaultMachine ?? 'local',
    command:
      command === undefined || command === null ? '' : shellLine(command),
    send: pathList(spec?.send).join('\n'),
    bringBack: pathList(spec?.bring_back).join('\n'),
    name: spec?.name ?? '',
    timeout:
      spec?.timeout === null || spec?.timeout === undefined
        ? ''
        : String(spec.timeout),
    gpus: text(spec?.resources?.gpus),
    cpus: text(spec?.resources?.cpus),
    memory: text(spec?.resources?.memory),
    nodes: text(spec?.resources?.nodes),
    partition: text(spec?.resources?.partition),
    requirements: spec?.environment?.requirements ?? '',
    packages: (spec?.environment?.packages ?? []).join('\n'),
    python: spec?.environment?.python ?? '',
    sameEnv: spec?.environment?.same_as_here ?? false,
    image: spec?.environment?.image ?? '',
    runtime: spec?.environment?.runtime ?? 'auto',
    registrySecret: spec?.registry_secret ?? ''
  };
}

/**
 * The Python environment and its image as the server reads them; nothing asked: undefined (the
 * machine's default).
 */
function environmentOf(values: Values): IEnvironment | undefined {
  const out: IEnvironment = {};
  if (values.requirements.trim()) {
    out.requirements = values.requirements.trim();
  }
  // one a line: a requirement may hold commas (numpy>=1.26,<3)
  const packages = values.packages
    .split('\n')
    .map(line => line.trim())
    .filter(line => line.length > 0);
  if (packages.length) {
    out.packages = packages;
  }
  if (values.python.trim()) {
    out.python = values.python.trim();
  }
  if (values.sameEnv) {
    out.same_as_here = true;
  }
  if (values.image.trim()) {
    out.image = values.image.trim();
    if (values.runtime !== 'auto') {
      out.runtime = values.runtime as IEnvironment['runtime'];
    }
  }
  return Object.keys(out).length ? out : undefined;
}

/**
 * How a job names a machine: its own name, `org:NAME` for one of the organization's.
 */
function jobMachine(machine: IMachine): string {
  return isOrganizations(machine) ? `org:${machine.name}` : machine.name;
}

/**
 * The form field a server error belongs to (`send[0]` → send, `env.TOKEN` → env, …).
 */
function fieldOf(field: string | null): keyof Values | 'env' | null {
  if (!field) {
    return null;
  }
  const head = field.split(/[.[]/)[0];
  if (head === 'environment') {
    const sub = field.slice('environment.'.length).split(/[.[]/)[0];
    return sub === 'same_as_here'
      ? 'sameEnv'
      : ['requirements', 'packages', 'python', 'image', 'runtime'].includes(sub)
        ? (sub as keyof Values)
        : 'requirements';
  }
  if (head === 'resources') {
    const sub = field.slice('resources.'.length);
    return (RESOURCE_FIELDS as readonly string[]).includes(sub)
      ? (sub as keyof Values)
      : null;
  }
  switch (head) {
    case 'registry_secret':
      return 'registrySecret';
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
  pickFiles?: PickFiles | null;
}): JSX.Element {
  const { model, trans, commands, pickFiles } = props;
  useSignal(model.changed);
  const [values, setValues] = React.useState<Values>(() =>
    fromSpec(props.spec, model.defaultMachine)
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
  const [envRows, setEnvRows] = React.useState<EnvRow[]>([]);
  const [envErrors, setEnvErrors] = React.useState<Record<string, string>>({});
  const [secretNames, setSecretNames] = React.useState<string[]>([]);
  React.useEffect(() => {
    // Names only: the listing never holds a value.
    getSecrets().then(
      data =>
        setSecretNames(data.secrets.filter(s => !s.problem).map(s => s.name)),
      () => setSecretNames([])
    );
  }, []);
  const nextKey = React.useRef(0);
  const setRow = (key: number, patch: Partial<EnvRow>): void => {
    setEnvRows(rows => rows.map(r => (r.key === key ? { ...r, ...patch } : r)));
    setEnvErrors({});
  };
  // The organization's machines run jobs through its service: a job names one `org:NAME`, which
  // no machine of the user's own can be called.
  const machines = model.machines.filter(
    m => m.enabled || jobMachine(m) === values.machine
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
    const resources = resourcesOf(values);
    if (resources) {
      spec.resources = resources;
    }
    const environment = environmentOf(values);
    if (environment) {
      spec.environment = environment;
    }
    // the machine's default image too: with no image at all the server says so beside the field
    if (values.registrySecret) {
      spec.registry_secret = values.registrySecret;
    }
    const typedEnv: Record<string, string> = {};
    for (const row of envRows) {
      if (row.name.trim()) {
        typedEnv[row.name.trim()] = row.value;
      }
    }
    if (envNames.length > 0 || Object.keys(typedEnv).length > 0) {
      // Kept from the job this one repeats (never shown), then the rows typed here.
      spec.env = { ...env, ...typedEnv };
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
      const envName = apiError.field?.startsWith('env.')
        ? apiError.field.slice('env.'.length).split(/[.[]/)[0]
        : null;
      if (field && field !== 'env') {
        setErrors({ [field]: apiError.message });
      } else if (envName && envRows.some(r => r.name.trim() === envName)) {
        setEnvErrors({ [envName]: apiError.message });
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
            {model.defaultMachine && (
              <option value={model.defaultMachine}>
                {trans.__(
                  '%1 (the organization’s default)',
                  model.defaultMachine.replace(/^org:/, '')
                )}
              </option>
            )}
            {machines.length === 0 && (
              <option value="local">{trans.__('This machine')}</option>
            )}
            {machines.map(m => (
              <option key={jobMachine(m)} value={jobMachine(m)}>
                {m.builtin
                  ? trans.__('This machine')
                  : isOrganizations(m)
                    ? `${m.name} (${m.kind}, ${trans.__('organization')})`
                    : `${m.name} (${m.kind})`}
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
          'One line for the machine’s shell, run in the job’s folder as written: &&, pipes and $VARS work, e.g. python prepare.py && python train.py --epochs 3'
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
      <fieldset className="jp-RemoteCompute-fieldset">
        <legend>{trans.__('Resources (optional)')}</legend>
        <p className="jp-RemoteCompute-fieldHelp">
          {trans.__(
            'Per node. Leave a field empty to take the machine’s default. A machine that cannot give what is asked refuses the job.'
          )}
        </p>
        {(
          [
            ['gpus', trans.__('GPUs'), trans.__('e.g. 2')],
            ['cpus', trans.__('CPUs'), trans.__('e.g. 8')],
            ['memory', trans.__('Memory'), trans.__('e.g. 32G or 512M')],
            ['nodes', trans.__('Nodes'), trans.__('e.g. 1')],
            [
              'partition',
              trans.__('Partition'),
              trans.__('A scheduler’s partition, e.g. gpu')
            ]
          ] as const
        ).map(([field, label, help]) => (
          <Field
            key={field}
            id={`${prefix}-${field}`}
            label={label}
            help={help}
            error={errors[field]}
          >
            {aria => (
              <input
                {...aria}
                className="jp-mod-styled"
                type="text"
                value={values[field]}
                autoComplete="off"
                spellCheck={false}
                onChange={e => set({ [field]: e.target.value })}
              />
            )}
          </Field>
        ))}
      </fieldset>
      <fieldset className="jp-RemoteCompute-fieldset">
        <legend>{trans.__('Python environment and image (optional)')}</legend>
        <p className="jp-RemoteCompute-fieldHelp">
          {trans.__(
            'Built once on the machine and reused while its content stays the same. Leave it empty for the machine’s default.'
          )}
        </p>
        <Field
          id={`${prefix}-requirements`}
          label={trans.__('Requirements file')}
          help={trans.__(
            'A workspace file: requirements.txt, pyproject.toml (with its uv.lock) or pylock.toml.'
          )}
          error={errors.requirements}
        >
          {aria => (
            <div className="jp-RemoteCompute-fileField">
              <input
                {...aria}
                className="jp-mod-styled"
                type="text"
                value={values.requirements}
                autoComplete="off"
                spellCheck={false}
                onChange={e => set({ requirements: e.target.value })}
              />
              {pickFiles && (
                <button
                  type="button"
                  className="jp-mod-styled"
                  aria-label={trans.__('Choose the requirements file')}
                  onClick={async () => {
                    const [picked] = await pickFiles({
                      title: trans.__('Choose the requirements file'),
                      folders: false,
                      accept: REQUIREMENTS_FILES
                    });
                    if (picked !== undefined) {
                      set({ requirements: picked });
                    }
                  }}
                >
                  {trans.__('Choose…')}
                </button>
              )}
            </div>
          )}
        </Field>
        <Field
          id={`${prefix}-packages`}
          label={trans.__('Packages')}
          help={trans.__('One requirement a line, e.g. scikit-learn>=1.5.')}
          error={errors.packages}
        >
          {aria => (
            <textarea
              {...aria}
              className="jp-mod-styled"
              rows={2}
              value={values.packages}
              spellCheck={false}
              onChange={e => set({ packages: e.target.value })}
            />
          )}
        </Field>
        <Field
          id={`${prefix}-python`}
          label={trans.__('Python version')}
          help={trans.__('e.g. 3.11; empty: the machine’s python3.')}
          error={errors.python}
        >
          {aria => (
            <input
              {...aria}
              className="jp-mod-styled"
              type="text"
              value={values.python}
              autoComplete="off"
              spellCheck={false}
              onChange={e => set({ python: e.target.value })}
            />
          )}
        </Field>
        <Field
          id={`${prefix}-same-env`}
          label={trans.__('The same packages as this server’s Python')}
          error={errors.sameEnv}
        >
          {aria => (
            <input
              {...aria}
              type="checkbox"
              checked={values.sameEnv}
              onChange={e => set({ sameEnv: e.target.checked })}
            />
          )}
        </Field>
        <Field
          id={`${prefix}-image`}
          label={trans.__('Image')}
          help={trans.__(
            'A container image the command runs in (any machine but a Jupyter server), e.g. nvidia/cuda:12.4.1-runtime-ubuntu22.04; the environment above is built inside it. Empty: the machine’s default.'
          )}
          error={errors.image}
        >
          {aria => (
            <input
              {...aria}
              className="jp-mod-styled"
              type="text"
              value={values.image}
              autoComplete="off"
              spellCheck={false}
              onChange={e => set({ image: e.target.value })}
            />
          )}
        </Field>
        <Field
          id={`${prefix}-runtime`}
          label={trans.__('Container runtime')}
          error={errors.runtime}
        >
          {aria => (
            <select
              {...aria}
              className="jp-mod-styled"
              value={values.runtime}
              disabled={!values.image.trim()}
              onChange={e => set({ runtime: e.target.value })}
            >
              <option value="auto">{trans.__('podman, else docker')}</option>
              <option value="podman">podman</option>
              <option value="docker">docker</option>
            </select>
          )}
        </Field>
        <Field
          id={`${prefix}-registry-secret`}
          label={trans.__('Registry credentials')}
          help={trans.__(
            'A stored secret whose value is user:password (or user:token) for a private registry, used for the pull only. None: the machine’s registry_secret, if it has one.'
          )}
          error={errors.registrySecret}
        >
          {aria => (
            <select
              {...aria}
              className="jp-mod-styled"
              value={values.registrySecret}
              onChange={e => set({ registrySecret: e.target.value })}
            >
              <option value="">{trans.__('None')}</option>
              {/* a repeated job's secret, even if it is no longer stored: the server says so */}
              {[
                ...new Set(
                  values.registrySecret
                    ? [...secretNames, values.registrySecret]
                    : secretNames
                )
              ].map(name => (
                <option key={name} value={name}>
                  {name}
                </option>
              ))}
            </select>
          )}
        </Field>
      </fieldset>
      <fieldset className="jp-RemoteCompute-fieldset">
        <legend>{trans.__('Environment (optional)')}</legend>
        <p className="jp-RemoteCompute-fieldHelp">
          {trans.__(
            'Type a value, or pick a stored secret: the job gets its value, and only its name is kept here. A typed value that looks like a secret is refused.'
          )}
        </p>
        {envRows.map(row => {
          const rowError = envErrors[row.name.trim()];
          const picked = row.value.startsWith(SECRET_PREFIX)
            ? row.value.slice(SECRET_PREFIX.length)
            : '';
          return (
            <div
              key={row.key}
              className="jp-RemoteCompute-envRow"
              data-invalid={rowError ? 'true' : 'false'}
            >
              <input
                className="jp-mod-styled jp-RemoteCompute-code"
                type="text"
                aria-label={trans.__('Variable name')}
                placeholder={trans.__('NAME')}
                value={row.name}
                autoComplete="off"
                spellCheck={false}
                onChange={e => setRow(row.key, { name: e.target.value })}
              />
              <input
                className="jp-mod-styled jp-RemoteCompute-code"
                type="text"
                aria-label={trans.__('Value of %1', row.name || '…')}
                aria-invalid={!!rowError}
                placeholder={trans.__('value')}
                value={row.value}
                autoComplete="off"
                spellCheck={false}
                onChange={e => setRow(row.key, { value: e.target.value })}
              />
              <select
                className="jp-mod-styled"
                aria-label={trans.__('Stored secret for %1', row.name || '…')}
                value={picked}
                onChange={e =>
                  setRow(row.key, {
                    value: e.target.value
                      ? `${SECRET_PREFIX}${e.target.value}`
                      : ''
                  })
                }
              >
                <option value="">{trans.__('Typed value')}</option>
                {secretNames.map(name => (
                  <option key={name} value={name}>
                    {trans.__('Secret: %1', name)}
                  </option>
                ))}
              </select>
              <Button
                type="button"
                minimal
                aria-label={trans.__('Remove %1', row.name || '…')}
                onClick={() =>
                  setEnvRows(rows => rows.filter(r => r.key !== row.key))
                }
              >
                ✕
              </Button>
              {rowError && (
                <div className="jp-RemoteCompute-fieldError" role="alert">
                  {rowError}
                </div>
              )}
            </div>
          );
        })}
        <Button
          type="button"
          minimal
          onClick={() =>
            setEnvRows(rows => [
              ...rows,
              { key: nextKey.current++, name: '', value: '' }
            ])
          }
        >
          {trans.__('Add a variable')}
        </Button>
      </fieldset>
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
    const { model, trans, commands, spec, keptEnv, pickFiles } = this._options;
    return (
      <JobForm
        model={model}
        trans={trans}
        commands={commands}
        spec={spec}
        keptEnv={keptEnv}
        pickFiles={pickFiles}
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
    /**
     * Picks workspace files (the requirements file); none without a file browser.
     */
    pickFiles?: PickFiles | null;
  }
}
