/**
 * The "Add a machine" / "Edit machine" form, in the main area.
 *
 * The fields of each kind come from the server (`kinds` of GET /machines). An option that
 * names a Secret Manager entry (`token_secret`) is asked as the secret itself (a password
 * field sent as `token`): the server stores it in the Secret Manager and compute.yaml keeps
 * only its name. The help says where that is (GET /secrets), and a token the deployment
 * provides can be chosen by name instead, read-only. Server-side errors carry the setting at
 * fault (`field`) and show inline.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { Button, ReactWidget } from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';
import * as React from 'react';

import {
  addMachine,
  addOrgMachine,
  APIError,
  getSecrets,
  IKind,
  IKindOption,
  IMachine,
  IMachineInput,
  IMachinePatch,
  ISecrets,
  updateMachine,
  updateOrgMachine
} from '../api';
import { computeIcon } from '../icons';
import { facesOf } from '../kindFaces';
import { asAPIError, ComputeModel } from '../model';
import { Field, useSignal } from './common';

type Values = {
  name: string;
  kind: string;
  address: string;
  enabled: boolean;
  token: string;
  options: Record<string, string | boolean>;
};

/**
 * Options shown without opening "More settings".
 */
const PRIMARY_OPTIONS = ['user', 'port', 'accelerator', 'use_spot', 'autostop'];

function humanize(name: string): string {
  const text = name.replace(/_/g, ' ');
  return text.charAt(0).toUpperCase() + text.slice(1);
}

function initialValues(
  machine: Partial<IMachine> | undefined,
  kinds: readonly IKind[]
): Values {
  const remote = kinds.filter(k => k.kind !== 'local');
  const options: Record<string, string | boolean> = {};
  for (const [key, value] of Object.entries(machine?.options ?? {})) {
    if (typeof value === 'boolean') {
      options[key] = value;
    } else if (value !== null && value !== undefined) {
      options[key] = String(value);
    }
  }
  return {
    name: machine?.name ?? '',
    kind:
      machine?.kind ??
      (remote.find(k => k.kind === 'ssh') ?? remote[0])?.kind ??
      'ssh',
    address: machine?.address ?? '',
    enabled: machine?.enabled ?? true,
    token: '',
    options
  };
}

/**
 * The form's own settings: what the server takes, minus secrets (they go as `token`).
 */
function optionPayload(
  kind: IKind | undefined,
  values: Values
): { options: Record<string, unknown>; bad: Record<string, string> } {
  const options: Record<string, unknown> = {};
  const bad: Record<string, string> = {};
  const known = kind?.options ?? {};
  for (const [key, raw] of Object.entries(values.options)) {
    const spec: IKindOption | undefined = known[key];
    if (spec?.secret_name) {
      // The stored secret's name: kept as it is (the server fills it when a token is given).
      if (typeof raw === 'string' && raw) {
        options[key] = raw;
      }
      continue;
    }
    if (typeof raw === 'boolean') {
      options[key] = raw;
      continue;
    }
    const text = raw.trim();
    if (!text) {
      continue;
    }
    if (spec && (spec.type === 'int' || spec.type === 'float')) {
      const n = Number(text);
      if (
        !Number.isFinite(n) ||
        (spec.type === 'int' && !Number.isInteger(n))
      ) {
        bad[`options.${key}`] = text;
        continue;
      }
      options[key] = n;
    } else {
      options[key] = text;
    }
  }
  return { options, bad };
}

function MachineForm(props: {
  model: ComputeModel;
  trans: TranslationBundle;
  commands: CommandRegistry;
  mode: 'add' | 'edit';
  machine?: Partial<IMachine>;
  /**
   * One of the organization's machines (an admin's form): saved and checked through its service.
   */
  organization?: boolean;
  onSaved: (machine: IMachine) => void;
  onCancel: () => void;
}): JSX.Element {
  const { model, trans, mode } = props;
  const organization = !!props.organization;
  useSignal(model.changed);
  const kinds = model.kinds.filter(k => k.kind !== 'local');
  const [values, setValues] = React.useState<Values>(() =>
    initialValues(props.machine, model.kinds)
  );
  const [errors, setErrors] = React.useState<Record<string, string>>({});
  const [formError, setFormError] = React.useState<APIError | null>(null);
  const [busy, setBusy] = React.useState(false);
  const [conflict, setConflict] = React.useState(false);
  const [moreOpen, setMoreOpen] = React.useState(false);
  const [secrets, setSecrets] = React.useState<ISecrets | null>(null);
  // The stored token's name, to go back to when "Enter a token" is chosen again.
  const typedSecret = React.useRef(
    String(props.machine?.options?.token_secret ?? '')
  );

  // Where tokens go, and the ones the deployment provides. A nicety: the form works without it.
  // The organization's tokens go to its service's own Secret Manager: the user's store is not asked.
  React.useEffect(() => {
    if (!organization) {
      getSecrets().then(setSecrets, () => setSecrets(null));
    }
  }, []);

  // Kinds arrive with the first GET; pick a sensible default once they do.
  React.useEffect(() => {
    if (
      mode === 'add' &&
      !props.machine?.kind &&
      kinds.length > 0 &&
      !kinds.some(k => k.kind === values.kind)
    ) {
      setValues(v => ({
        ...v,
        kind: (kinds.find(k => k.kind === 'ssh') ?? kinds[0]).kind
      }));
    }
  }, [kinds.map(k => k.kind).join(',')]);

  const kind = model.kinds.find(k => k.kind === values.kind);
  const prefix = `jp-RemoteCompute-machine-${mode}`;

  const set = (patch: Partial<Values>): void => {
    setValues(v => ({ ...v, ...patch }));
    const cleared = { ...errors };
    for (const key of Object.keys(patch)) {
      delete cleared[key];
    }
    setErrors(cleared);
  };
  const setOption = (key: string, value: string | boolean): void => {
    setValues(v => ({ ...v, options: { ...v.options, [key]: value } }));
    const cleared = { ...errors };
    delete cleared[`options.${key}`];
    setErrors(cleared);
  };

  const save = async (andCheck: boolean): Promise<void> => {
    const local: Record<string, string> = {};
    if (mode === 'add' && !values.name.trim()) {
      local.name = trans.__('A name is required.');
    }
    if (!values.address.trim()) {
      local.address = trans.__('An address is required.');
    }
    const { options, bad } = optionPayload(kind, values);
    for (const key of Object.keys(bad)) {
      local[key] = trans.__('Expected a number.');
      setMoreOpen(true);
    }
    if (Object.keys(local).length > 0) {
      setErrors(local);
      return;
    }
    setBusy(true);
    setFormError(null);
    setConflict(false);
    try {
      let saved: IMachine;
      if (mode === 'add') {
        const input: IMachineInput = {
          name: values.name.trim(),
          kind: values.kind,
          address: values.address.trim(),
          options,
          enabled: values.enabled,
          // compute.yaml's version is the user's; the service keeps its own file.
          version: organization ? undefined : model.version || undefined
        };
        if (values.token) {
          input.token = values.token;
        }
        if (organization) {
          saved = await addOrgMachine(input);
        } else {
          saved = await addMachine(input);
          facesOf(values.kind).afterAdd?.(saved.name, saved, trans);
        }
      } else {
        const patch: IMachinePatch = {
          address: values.address.trim(),
          options,
          enabled: values.enabled,
          version: organization ? undefined : model.version || undefined
        };
        if (values.token) {
          patch.token = values.token;
        }
        const name = props.machine?.name ?? values.name;
        saved = organization
          ? await updateOrgMachine(name, patch)
          : await updateMachine(name, patch);
      }
      setValues(v => ({ ...v, token: '' }));
      await model.refresh().catch(() => undefined);
      props.onSaved(saved);
      if (andCheck) {
        void props.commands.execute('remote-compute:check-machine', {
          name: saved.name,
          organization
        });
      }
    } catch (error) {
      const apiError = asAPIError(error);
      if (apiError.status === 409 || apiError.code === 'conflict') {
        setConflict(true);
      } else if (apiError.field && fieldKnown(apiError.field)) {
        setErrors({ [apiError.field]: apiError.message });
        if (apiError.field.startsWith('options.')) {
          setMoreOpen(true);
        }
      } else {
        setFormError(apiError);
      }
    } finally {
      setBusy(false);
    }
  };

  const fieldKnown = (field: string): boolean =>
    ['name', 'kind', 'address', 'token', 'enabled'].includes(field) ||
    (field.startsWith('options.') &&
      Object.prototype.hasOwnProperty.call(
        kind?.options ?? {},
        field.slice(8)
      ));

  const reload = async (): Promise<void> => {
    await model.refresh().catch(() => undefined);
    if (mode === 'edit' && props.machine?.name) {
      const fresh = model.machine(props.machine.name);
      if (fresh) {
        setValues(initialValues(fresh, model.kinds));
      }
    }
    setConflict(false);
  };

  const secretOption = Object.entries(kind?.options ?? {}).find(
    ([, o]) => o.secret_name
  );
  // Deployment secrets that can be used (a file others can read is not offered).
  const provided = (secrets?.secrets ?? []).filter(
    e => e.read_only && !e.problem
  );
  const chosenSecret = secretOption
    ? String(values.options[secretOption[0]] ?? '')
    : '';
  const usesProvided = provided.some(e => e.name === chosenSecret);
  // Back from a deployment token to a typed one: the machine's own entry, never the deployment's.
  const ownSecretName = (): string => {
    const before = typedSecret.current;
    if (before && !provided.some(e => e.name === before)) {
      return before;
    }
    const name = values.name.trim() || props.machine?.name || '';
    return name ? `compute/${name}` : '';
  };
  const plainOptions = Object.entries(kind?.options ?? {}).filter(
    ([, o]) => !o.secret_name
  );
  // The usual settings first; the rest (key files, folders) behind "More settings".
  const primaryOptions = plainOptions.filter(
    ([key, o]) => o.required || PRIMARY_OPTIONS.includes(key)
  );
  const extraOptions = plainOptions.filter(
    ([key, o]) => !(o.required || PRIMARY_OPTIONS.includes(key))
  );
  const renderOption = ([key, option]: [string, IKindOption]): JSX.Element => {
    const id = `${prefix}-option-${key}`;
    const value = values.options[key];
    if (option.type === 'bool') {
      return (
        <Field
          key={key}
          id={id}
          label={humanize(key)}
          help={option.description}
          error={errors[`options.${key}`]}
        >
          {aria => (
            <input
              {...aria}
              type="checkbox"
              checked={value === true}
              onChange={e => setOption(key, e.target.checked)}
            />
          )}
        </Field>
      );
    }
    return (
      <Field
        key={key}
        id={id}
        label={
          option.required
            ? humanize(key)
            : trans.__('%1 (optional)', humanize(key))
        }
        help={option.description}
        error={errors[`options.${key}`]}
      >
        {aria => (
          <input
            {...aria}
            className="jp-mod-styled"
            type="text"
            inputMode={
              option.type === 'int' || option.type === 'float'
                ? 'numeric'
                : undefined
            }
            value={typeof value === 'string' ? value : ''}
            autoComplete="off"
            spellCheck={false}
            onChange={e => setOption(key, e.target.value)}
          />
        )}
      </Field>
    );
  };
  const title =
    mode === 'add'
      ? trans.__('Add a machine')
      : trans.__('Edit machine %1', props.machine?.name ?? '');

  return (
    <form
      className="jp-RemoteCompute-form"
      aria-label={title}
      onSubmit={e => {
        e.preventDefault();
        void save(true);
      }}
    >
      <h2 className="jp-RemoteCompute-formTitle">{title}</h2>
      {conflict && (
        <div className="jp-RemoteCompute-banner" role="alert">
          <span>
            {trans.__(
              'compute.yaml changed on disk since the machines were loaded. Reload to see the current file, then save again.'
            )}
          </span>
          <Button type="button" onClick={() => void reload()}>
            {trans.__('Reload')}
          </Button>
        </div>
      )}
      {formError && (
        <div className="jp-RemoteCompute-banner" role="alert">
          {formError.message}
        </div>
      )}
      <Field
        id={`${prefix}-name`}
        label={trans.__('Name')}
        help={trans.__(
          'Lowercase letters, digits and "-"; up to 40 characters.'
        )}
        error={errors.name}
      >
        {aria => (
          <input
            {...aria}
            className="jp-mod-styled"
            type="text"
            value={values.name}
            disabled={mode === 'edit'}
            autoComplete="off"
            spellCheck={false}
            onChange={e => set({ name: e.target.value })}
          />
        )}
      </Field>
      <Field id={`${prefix}-kind`} label={trans.__('Kind')} error={errors.kind}>
        {aria => (
          <select
            {...aria}
            className="jp-mod-styled"
            value={values.kind}
            disabled={mode === 'edit'}
            onChange={e => set({ kind: e.target.value })}
          >
            {kinds.length === 0 && (
              <option value={values.kind}>{values.kind}</option>
            )}
            {kinds.map(k => (
              <option key={k.kind} value={k.kind}>
                {/* What to install is said under the list, once the kind is picked. */}
                {k.unavailable
                  ? trans.__('%1 (needs more software)', k.label || k.kind)
                  : k.label || k.kind}
              </option>
            ))}
          </select>
        )}
      </Field>
      <Field
        id={`${prefix}-address`}
        label={trans.__('Address')}
        help={
          values.kind === 'jupyter'
            ? trans.__(
                "The Jupyter Server's URL, e.g. https://hub.example.org/user/ana/"
              )
            : values.kind === 'ssh'
              ? trans.__(
                  'A host name, user@host, or an alias from ~/.ssh/config.'
                )
              : values.kind === 'skypilot'
                ? trans.__(
                    "SkyPilot's infra: aws, gcp/us-central1, k8s or slurm/<cluster> (see `sky check`)."
                  )
                : undefined
        }
        error={errors.address}
      >
        {aria => (
          <input
            {...aria}
            className="jp-mod-styled"
            type="text"
            value={values.address}
            autoComplete="off"
            spellCheck={false}
            onChange={e => set({ address: e.target.value })}
          />
        )}
      </Field>
      {kind?.unavailable && (
        <p className="jp-RemoteCompute-kindUnavailable" role="note">
          {trans.__('This kind needs more software: %1', kind.unavailable)}
        </p>
      )}
      {!kind?.unavailable && primaryOptions.map(renderOption)}
      {!kind?.unavailable && extraOptions.length > 0 && (
        <details
          className="jp-RemoteCompute-more"
          open={moreOpen}
          onToggle={e => setMoreOpen((e.target as HTMLDetailsElement).open)}
        >
          <summary>{trans.__('More settings')}</summary>
          {extraOptions.map(renderOption)}
        </details>
      )}
      {secretOption && provided.length > 0 && (
        <Field
          id={`${prefix}-token-source`}
          label={trans.__('Token source')}
          help={trans.__(
            'Tokens the deployment provides are used by name and cannot be changed here.'
          )}
        >
          {aria => (
            <select
              {...aria}
              className="jp-mod-styled"
              value={usesProvided ? chosenSecret : ''}
              onChange={e =>
                setOption(secretOption[0], e.target.value || ownSecretName())
              }
            >
              <option value="">{trans.__('Enter a token')}</option>
              {provided.map(s => (
                <option key={s.name} value={s.name}>
                  {trans.__('%1 (provided by the deployment)', s.name)}
                </option>
              ))}
            </select>
          )}
        </Field>
      )}
      {secretOption && !usesProvided && (
        <Field
          id={`${prefix}-token`}
          label={trans.__('Token')}
          help={
            <>
              {organization
                ? trans.__(
                    "The token goes to the organization service's own Secret Manager; no user ever sees it."
                  )
                : trans.__(
                    'The token goes to the Secret Manager, in %1; compute.yaml keeps only its name (%2).',
                    secrets?.store.where ?? trans.__('the system keyring'),
                    secretOption[0]
                  )}
              {mode === 'edit' &&
                ' ' + trans.__('Leave empty to keep the stored token.')}
              {secrets?.store.note && (
                <span className="jp-RemoteCompute-secretNote">
                  {' ' + secrets.store.note}
                </span>
              )}
              {secrets && !secrets.store.usable && (
                <span className="jp-RemoteCompute-secretProblem">
                  {' ' + (secrets.store.problem ?? '')}
                </span>
              )}
            </>
          }
          error={errors.token}
        >
          {aria => (
            <input
              {...aria}
              className="jp-mod-styled"
              type="password"
              value={values.token}
              autoComplete="new-password"
              onChange={e => set({ token: e.target.value })}
            />
          )}
        </Field>
      )}
      <div className="jp-RemoteCompute-field jp-RemoteCompute-fieldInline">
        <input
          id={`${prefix}-enabled`}
          type="checkbox"
          checked={values.enabled}
          onChange={e => set({ enabled: e.target.checked })}
        />
        <label htmlFor={`${prefix}-enabled`}>{trans.__('Enabled')}</label>
      </div>
      <div className="jp-RemoteCompute-formButtons">
        <Button
          type="submit"
          disabled={busy || !!kind?.unavailable}
          className="jp-mod-accept"
        >
          {trans.__('Save and check')}
        </Button>
        <Button
          type="button"
          disabled={busy || !!kind?.unavailable}
          onClick={() => void save(false)}
        >
          {trans.__('Save')}
        </Button>
        <Button type="button" minimal onClick={props.onCancel}>
          {trans.__('Cancel')}
        </Button>
        {busy && (
          <span className="jp-RemoteCompute-busy">{trans.__('Saving…')}</span>
        )}
      </div>
    </form>
  );
}

/**
 * The form as a main-area widget; it closes itself after a successful save.
 */
export class MachineFormWidget extends ReactWidget {
  constructor(options: MachineFormWidget.IOptions) {
    super();
    this._options = options;
    const { trans, mode, machine, organization } = options;
    this.addClass('jp-RemoteCompute-formWidget');
    if (organization) {
      this.title.label =
        mode === 'add'
          ? trans.__("Add an organization's machine")
          : trans.__("Organization's machine %1", machine?.name ?? '');
    } else {
      this.title.label =
        mode === 'add'
          ? trans.__('Add a machine')
          : trans.__('Machine %1', machine?.name ?? '');
    }
    this.title.icon = computeIcon;
    this.title.closable = true;
  }

  render(): JSX.Element {
    const { model, trans, commands, mode, machine, organization } =
      this._options;
    return (
      <MachineForm
        model={model}
        trans={trans}
        commands={commands}
        mode={mode}
        machine={machine}
        organization={organization}
        onSaved={() => this.close()}
        onCancel={() => this.close()}
      />
    );
  }

  private _options: MachineFormWidget.IOptions;
}

export namespace MachineFormWidget {
  export interface IOptions {
    model: ComputeModel;
    trans: TranslationBundle;
    commands: CommandRegistry;
    mode: 'add' | 'edit';
    machine?: Partial<IMachine>;
    /**
     * One of the organization's machines, set by an admin through the hub's service.
     */
    organization?: boolean;
  }
}
