/**
 * The "Add a Machine" / "Edit Machine" form, in the main area, drawn from the JSON Schema the
 * server reads a machine with (`GET /schemas/MachineInput`) and the options each kind declares
 * (`kinds` of GET /machines), in JupyterLab's own form component as the New Job form and the
 * pipeline step's settings are (`forms/uiSchema.tsx`; `machineFormUi.tsx` says how).
 *
 * An option that names a Secret Manager entry (`token_secret`) is asked as the secret itself (a
 * password field sent as `token`): the server stores it in the Secret Manager and compute.yaml
 * keeps only its name. The help says where that is (GET /secrets), and a token the deployment
 * provides can be chosen by name instead, read-only. Settings are checked by the server only: its
 * error carries the setting at fault (`field`) and shows on it.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { Button, ReactWidget } from '@jupyterlab/ui-components';
import { ReadonlyJSONObject } from '@lumino/coreutils';
import { CommandRegistry } from '@lumino/commands';
import * as React from 'react';

import {
  addMachine,
  addOrgMachine,
  getFormSchema,
  getSecrets,
  IKind,
  IMachine,
  IMachineInput,
  IMachinePatch,
  ISecrets,
  updateMachine,
  updateOrgMachine
} from '../api';
import {
  fieldErrors,
  PlacedProblem,
  SchemaForm,
  settingsUiSchema,
  stillStanding
} from '../forms/uiSchema';
import { computeIcon } from '../icons';
import { facesOf } from '../kindFaces';
import { asAPIError, ComputeModel } from '../model';
import { useSignal } from './common';
import {
  machineSchema,
  machineUiSchema,
  optionGroups,
  TOKEN_SOURCE
} from './machineFormUi';

type Data = Record<string, unknown>;

type Values = {
  name: string;
  kind: string;
  address: string;
  enabled: boolean;
  token: string;
  options: Record<string, unknown>;
  /**
   * Who may use an organization's machine: hub users and groups (both empty: every member).
   */
  access: { users: string[]; groups: string[] };
};

let requestOnce: Promise<Data> | null = null;

/**
 * The request's schema, asked once a page.
 */
function requestSchema(): Promise<Data> {
  requestOnce ??= getFormSchema('MachineInput').catch(error => {
    requestOnce = null;
    throw error;
  });
  return requestOnce;
}

function initialValues(
  machine: Partial<IMachine> | undefined,
  kinds: readonly IKind[]
): Values {
  const remote = kinds.filter(k => k.kind !== 'local');
  const options: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(machine?.options ?? {})) {
    if (typeof value === 'boolean' || Array.isArray(value)) {
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
    options,
    access: {
      users: [...(machine?.access?.users ?? [])],
      groups: [...(machine?.access?.groups ?? [])]
    }
  };
}

/**
 * The access list as the service takes it: each name once, trimmed, empty lines left out.
 */
function accessPayload(access: Values['access']): {
  users: string[];
  groups: string[];
} {
  const clean = (names: string[]): string[] => [
    ...new Set(names.map(n => n.trim()).filter(Boolean))
  ];
  return { users: clean(access.users), groups: clean(access.groups) };
}

/**
 * The kind's options as the server takes them: numbers where it expects them (a text that is
 * none is sent as typed, and the server names the option), the token's entry by name, empty
 * ones left out.
 */
function optionPayload(
  kind: IKind | undefined,
  values: Values
): Record<string, unknown> {
  const options: Record<string, unknown> = {};
  for (const [key, spec] of Object.entries(kind?.options ?? {})) {
    const raw = values.options[key];
    if (typeof raw === 'boolean' || (Array.isArray(raw) && raw.length)) {
      options[key] = raw;
      continue;
    }
    const text = typeof raw === 'string' ? raw.trim() : '';
    if (!text) {
      continue;
    }
    const n = Number(text);
    options[key] =
      !spec.secret_name &&
      (spec.type === 'int' || spec.type === 'float') &&
      Number.isFinite(n) &&
      (spec.type === 'float' || Number.isInteger(n))
        ? n
        : text;
  }
  return options;
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
  const [request, setRequest] = React.useState<Data | null>(null);
  const [loadError, setLoadError] = React.useState<string | null>(null);
  React.useEffect(() => {
    requestSchema().then(setRequest, error =>
      setLoadError(asAPIError(error).message)
    );
  }, []);
  const [values, setValues] = React.useState<Values>(() =>
    initialValues(props.machine, model.kinds)
  );
  const [problems, setProblems] = React.useState<PlacedProblem[]>([]);
  const [formError, setFormError] = React.useState<string | null>(null);
  const [busy, setBusy] = React.useState(false);
  const [conflict, setConflict] = React.useState(false);
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
  const { primary, more, secret } = optionGroups(kind);
  // Deployment secrets that can be used (a file others can read is not offered).
  const provided = (secrets?.secrets ?? [])
    .filter(e => e.read_only && !e.problem)
    .map(e => e.name);
  const chosenSecret = secret ? String(values.options[secret] ?? '') : '';
  const usesProvided = provided.includes(chosenSecret);
  // Back from a deployment token to a typed one: the machine's own entry, never the deployment's.
  const ownSecretName = (): string => {
    const before = typedSecret.current;
    if (before && !provided.includes(before)) {
      return before;
    }
    const name = values.name.trim() || props.machine?.name || '';
    return name ? `compute/${name}` : '';
  };

  const schema = React.useMemo(
    () =>
      request &&
      machineSchema(
        request,
        kinds,
        kind,
        {
          shown: !usesProvided,
          provided
        },
        organization
      ),
    [request, kinds.length, kind, usesProvided, provided.join(',')]
  );
  const uiSchema = React.useMemo(
    () =>
      settingsUiSchema(
        schema,
        machineUiSchema({ trans, kinds, kind, mode, organization, secrets })
      ),
    [schema, kind, secrets]
  );
  const pick = (options: [string, unknown][]): Data =>
    Object.fromEntries(
      options
        .map(([key]) => [key, values.options[key]])
        .filter(([, v]) => v !== undefined)
    );
  const data: Data = {
    name: values.name,
    kind: values.kind,
    address: values.address,
    enabled: values.enabled,
    token: values.token,
    options: pick(primary),
    more: pick(more),
    [TOKEN_SOURCE]: usesProvided ? chosenSecret : '',
    ...(organization ? { access: values.access } : {})
  };
  const placeOf = (field: string | null | undefined): string[] => {
    const [head, key] = (field ?? '').split(/[.[]/);
    if (head === 'options' && key) {
      return primary.some(([k]) => k === key)
        ? ['options', key]
        : more.some(([k]) => k === key)
          ? ['more', key]
          : [];
    }
    return ['name', 'kind', 'address', 'token', 'enabled', 'access'].includes(
      head
    )
      ? [head]
      : [];
  };

  const save = async (andCheck: boolean): Promise<void> => {
    setBusy(true);
    setFormError(null);
    setProblems([]);
    setConflict(false);
    const options = optionPayload(kind, values);
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
          input.access = accessPayload(values.access);
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
        if (organization) {
          // The whole list as the form shows it: emptied, it is cleared.
          patch.access = accessPayload(values.access);
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
      const path = placeOf(apiError.field);
      if (apiError.status === 409 || apiError.code === 'conflict') {
        setConflict(true);
      } else if (path.length) {
        // An Error's message is its own but not enumerable: named, not spread.
        setProblems([
          { field: path.join('.'), message: apiError.message, path }
        ]);
      } else {
        setFormError(apiError.message);
      }
    } finally {
      setBusy(false);
    }
  };

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

  const title =
    mode === 'add'
      ? trans.__('Add a Machine')
      : trans.__('Edit Machine %1', props.machine?.name ?? '');

  return (
    <div
      className="jp-RemoteCompute-form jp-RemoteCompute-schemaForm"
      role="form"
      aria-label={title}
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
      {(formError || loadError) && (
        <div className="jp-RemoteCompute-banner" role="alert">
          {formError || loadError}
        </div>
      )}
      {schema && (
        <SchemaForm
          idPrefix={`jp-RemoteCompute-machine-${mode}`}
          schema={schema}
          formData={data as ReadonlyJSONObject}
          extraErrors={fieldErrors(problems, schema)}
          uiSchema={uiSchema}
          formContext={{ trans }}
          onChange={event => {
            const next = (event.formData ?? {}) as Data;
            const options: Record<string, unknown> = {
              ...values.options,
              ...(next.options as Data | undefined),
              ...(next.more as Data | undefined)
            };
            const source = String(next[TOKEN_SOURCE] ?? '');
            if (secret && source !== String(data[TOKEN_SOURCE])) {
              options[secret] = source || ownSecretName();
            }
            setProblems(ps => stillStanding(ps, data, next));
            setValues({
              name: String(next.name ?? ''),
              kind: String(next.kind ?? values.kind),
              address: String(next.address ?? ''),
              enabled: next.enabled !== false,
              token: String(next.token ?? ''),
              options,
              access: {
                users: ((next.access as Data | undefined)?.users ??
                  []) as string[],
                groups: ((next.access as Data | undefined)?.groups ??
                  []) as string[]
              }
            });
          }}
          onSubmit={() => void save(true)}
        />
      )}
      <div className="jp-RemoteCompute-formButtons">
        <button
          type="button"
          className="jp-mod-styled jp-mod-accept"
          disabled={busy || !schema || !!kind?.unavailable}
          onClick={() => void save(true)}
        >
          {trans.__('Save and check')}
        </button>
        <button
          type="button"
          className="jp-mod-styled jp-mod-reject"
          disabled={busy || !schema || !!kind?.unavailable}
          onClick={() => void save(false)}
        >
          {trans.__('Save')}
        </button>
        <Button type="button" minimal onClick={props.onCancel}>
          {trans.__('Cancel')}
        </Button>
        {busy && (
          <span className="jp-RemoteCompute-busy">{trans.__('Saving…')}</span>
        )}
      </div>
    </div>
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
          ? trans.__('Add a Machine')
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
