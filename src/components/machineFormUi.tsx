/**
 * How the machine form draws a machine: the request's own schema (`GET /schemas/MachineInput`:
 * name, kind, address, enabled, token) with the options of the kind picked as its settings, each
 * as its engine declares it (`GET /kinds`), the usual ones first and the rest under "More
 * settings". An option naming a Secret Manager entry (`token_secret`) is asked as the token
 * itself, or a token the deployment provides is picked by name. The conventions every form
 * shares are in `forms/uiSchema.tsx`.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { RJSFSchema, WidgetProps } from '@rjsf/utils';
import * as React from 'react';

import { IKind, IKindOption, ISecrets } from '../api';
import { invalid } from '../forms/formTemplates';
import { FormUiSchema } from '../forms/uiSchema';

type Schema = Record<string, unknown>;

/**
 * Options shown without opening "More settings".
 */
const PRIMARY_OPTIONS = ['user', 'port', 'accelerator', 'use_spot', 'autostop'];

/**
 * The form's own settings that are not the request's: which token is used.
 */
export const TOKEN_SOURCE = 'token_source';

function humanize(name: string): string {
  const text = name.replace(/_/g, ' ');
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/**
 * The kind's options as the form groups them: the usual ones, the rest, and the one naming
 * the token's Secret Manager entry.
 */
export function optionGroups(kind: IKind | undefined): {
  primary: [string, IKindOption][];
  more: [string, IKindOption][];
  secret: string | null;
} {
  const all = Object.entries(kind?.options ?? {});
  const plain = all.filter(([, o]) => !o.secret_name);
  const isPrimary = ([key, o]: [string, IKindOption]): boolean =>
    o.required || PRIMARY_OPTIONS.includes(key);
  return {
    primary: plain.filter(isPrimary),
    more: plain.filter(o => !isPrimary(o)),
    secret: all.find(([, o]) => o.secret_name)?.[0] ?? null
  };
}

function optionSchema(option: IKindOption): Schema {
  // Numbers (and a table of settings) are typed as text and read by the server, which names the
  // option when one is not; a list is a box of lines.
  const description = option.description;
  return option.type === 'list'
    ? { type: 'array', items: { type: 'string' }, description }
    : { type: option.type === 'bool' ? 'boolean' : 'string', description };
}

function group(options: [string, IKindOption][]): Schema {
  return {
    type: 'object',
    properties: Object.fromEntries(
      options.map(([k, o]) => [k, optionSchema(o)])
    ),
    required: options.filter(([, o]) => o.required).map(([k]) => k)
  };
}

/**
 * The schema the form draws for `kind`: the request's settings but its options, version and
 * token, then the kind's options; the token and where it comes from when the kind takes one.
 */
export function machineSchema(
  request: Schema,
  kinds: readonly IKind[],
  kind: IKind | undefined,
  token: { shown: boolean; provided: readonly string[] },
  organization = false
): RJSFSchema {
  const own = (request.properties ?? {}) as Record<string, Schema>;
  const { primary, more, secret } = optionGroups(kind);
  // The request's help is the API's: the form says its own (machineUiSchema).
  const plain = (key: string): Schema => ({
    ...own[key],
    description: undefined
  });
  const properties: Record<string, Schema> = {
    name: plain('name'),
    kind: {
      ...plain('kind'),
      enum: kinds.length ? kinds.map(k => k.kind) : [kind?.kind ?? 'ssh']
    },
    address: plain('address')
  };
  if (!kind?.unavailable) {
    if (primary.length) {
      properties.options = group(primary);
    }
    if (more.length) {
      properties.more = group(more);
    }
    if (secret && token.provided.length) {
      properties[TOKEN_SOURCE] = {
        type: 'string',
        enum: ['', ...token.provided]
      };
    }
    if (secret && token.shown) {
      properties.token = { type: 'string' };
    }
  }
  properties.enabled = plain('enabled');
  if (organization) {
    properties.access = accessSchema(request);
  }
  return {
    type: 'object',
    required: ['name', 'kind', 'address'],
    properties
  } as RJSFSchema;
}

/**
 * Who may use an organization's machine, as the request reads it (`MachineAccess`): its users and
 * groups, each a box of lines.
 */
function accessSchema(request: Schema): Schema {
  const defs = (request.$defs ?? {}) as Record<string, Schema>;
  const own = (defs.MachineAccess?.properties ?? {}) as Record<string, Schema>;
  const lines = (key: string): Schema => ({
    type: 'array',
    items: { type: 'string' },
    ...own[key],
    description: undefined,
    default: undefined
  });
  return {
    type: 'object',
    properties: { users: lines('users'), groups: lines('groups') }
  };
}

/**
 * A choice among named values, each with its label (`ui:enumNames`): the option's value is the
 * value itself, as a person and a test pick it.
 */
function ChoiceWidget(props: WidgetProps): JSX.Element {
  const values = (props.schema.enum ?? []) as string[];
  const names = (props.uiSchema?.['ui:enumNames'] ?? []) as string[];
  return (
    <select
      id={props.id}
      className="jp-mod-styled"
      value={String(props.value ?? '')}
      aria-invalid={invalid(props)}
      disabled={props.disabled || props.readonly}
      onChange={e => props.onChange(e.target.value)}
    >
      {values.map((value, i) => (
        <option key={value} value={value}>
          {names[i] ?? value}
        </option>
      ))}
    </select>
  );
}

function optionUi(
  options: [string, IKindOption][],
  trans: TranslationBundle
): FormUiSchema {
  return Object.fromEntries(
    options.map(([key, o]) => [
      key,
      {
        'ui:title':
          o.required || o.type === 'bool'
            ? humanize(key)
            : trans.__('%1 (optional)', humanize(key)),
        ...(o.type === 'int' || o.type === 'float'
          ? { 'ui:options': { inputType: 'text', inputMode: 'numeric' } }
          : {})
      }
    ])
  );
}

/**
 * The form's own uiSchema for `kind`.
 */
export function machineUiSchema(options: {
  trans: TranslationBundle;
  kinds: readonly IKind[];
  kind: IKind | undefined;
  mode: 'add' | 'edit';
  organization: boolean;
  secrets: ISecrets | null;
}): FormUiSchema {
  const { trans, kinds, kind, mode, organization, secrets } = options;
  const { primary, more, secret } = optionGroups(kind);
  const addressHelp: Record<string, string> = {
    jupyter: trans.__(
      "The Jupyter Server's URL, e.g. `https://hub.example.org/user/ana/`"
    ),
    ssh: trans.__(
      'A host name, `user@host`, or an alias from `~/.ssh/config`.'
    ),
    skypilot: trans.__(
      "SkyPilot's infra: `aws`, `gcp/us-central1`, `k8s` or `slurm/<cluster>` (see `sky check`)."
    )
  };
  const tokenHelp = [
    organization
      ? trans.__(
          "The token goes to the organization service's own Secret Manager; no user ever sees it."
        )
      : trans.__(
          'The token goes to the Secret Manager, in %1; compute.yaml keeps only its name (`%2`).',
          secrets?.store.where ?? trans.__('the system keyring'),
          secret ?? ''
        ),
    mode === 'edit' ? trans.__('Leave empty to keep the stored token.') : '',
    secrets?.store.note ?? '',
    secrets && !secrets.store.usable ? (secrets.store.problem ?? '') : ''
  ]
    .filter(Boolean)
    .join(' ');
  return {
    'ui:order': [
      'name',
      'kind',
      'address',
      'options',
      'more',
      TOKEN_SOURCE,
      'token',
      'enabled',
      'access'
    ],
    name: {
      'ui:title': trans.__('Name'),
      'ui:description': trans.__(
        'Lowercase letters, digits and "-"; up to 40 characters.'
      ),
      'ui:disabled': mode === 'edit'
    },
    kind: {
      'ui:widget': ChoiceWidget,
      'ui:title': trans.__('Kind'),
      'ui:description': kind?.unavailable
        ? trans.__('This kind needs more software: %1', kind.unavailable)
        : undefined,
      'ui:disabled': mode === 'edit',
      // What to install is said under the list, once the kind is picked.
      'ui:enumNames': kinds.map(k =>
        k.unavailable
          ? trans.__('%1 (needs more software)', k.label || k.kind)
          : k.label || k.kind
      )
    },
    address: {
      'ui:title': trans.__('Address'),
      'ui:description': addressHelp[kind?.kind ?? '']
    },
    options: {
      'ui:ObjectFieldTemplate': PlainGroup,
      ...optionUi(primary, trans)
    },
    more: {
      'ui:title': trans.__('More settings'),
      ...optionUi(more, trans)
    },
    [TOKEN_SOURCE]: {
      'ui:widget': ChoiceWidget,
      'ui:title': trans.__('Token source'),
      'ui:description': trans.__(
        'Tokens the deployment provides are used by name and cannot be changed here.'
      ),
      'ui:enumNames': [
        trans.__('Enter a token'),
        ...((secrets?.secrets ?? [])
          .filter(e => e.read_only && !e.problem)
          .map(s => trans.__('%1 (provided by the deployment)', s.name)) ?? [])
      ]
    },
    token: {
      'ui:widget': 'password',
      'ui:title': trans.__('Token'),
      'ui:description': tokenHelp,
      'ui:options': { autocomplete: 'new-password' }
    },
    enabled: {
      'ui:title': trans.__('Enabled'),
      'ui:description': trans.__('Jobs may run on it.')
    },
    access: {
      'ui:title': trans.__('Who may use it'),
      'ui:description': trans.__(
        "JupyterHub users and groups, one a line. None: every member with the organization's use scope. Anyone else does not see the machine and is refused it; admins may use every machine."
      ),
      'ui:options': { expanded: true, none: trans.__('every member') },
      users: { 'ui:title': trans.__('Users (optional)') },
      groups: { 'ui:title': trans.__('Groups (optional)') }
    }
  };
}

/**
 * The usual options, drawn as if they were the form's own fields (no section around them).
 */
function PlainGroup(props: {
  properties: { content: React.ReactElement }[];
}): JSX.Element {
  return <>{props.properties.map(p => p.content)}</>;
}
