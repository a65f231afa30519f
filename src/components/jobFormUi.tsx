/**
 * How the New Job form draws the job request's schema: which settings it offers and in what
 * order, their titles and help in a person's words (the schema's are the API's), and the two
 * pickers of its own: the machine among the panel's, the registry's credentials among the stored
 * secrets. The conventions every form shares are in `forms/uiSchema.tsx`.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { WidgetProps } from '@rjsf/utils';
import * as React from 'react';

import { IMachine, IPool } from '../api';
import { EnvRowsField } from '../forms/EnvField';
import { invalid } from '../forms/formTemplates';
import { FormUiSchema } from '../forms/uiSchema';
import { isOrganizations } from './MachineList';

/**
 * The settings of a job request the form offers, in its order; the others (the idempotency key,
 * retries, checkpoints) are the API's and the CLI's.
 */
export const SHOWN = [
  'machine',
  'command',
  'send',
  'bring_back',
  'name',
  'timeout',
  'resources',
  'environment',
  'registry_secret',
  'env'
];

/**
 * How a job names a machine: its own name, `org:NAME` for one of the organization's.
 */
export function jobMachine(machine: IMachine): string {
  return isOrganizations(machine) ? `org:${machine.name}` : machine.name;
}

interface IJobFormContext {
  trans: TranslationBundle;
  machines: readonly IMachine[];
  pools: readonly IPool[];
  defaultMachine: string | null;
  secretNames: readonly string[];
}

function context(props: WidgetProps): IJobFormContext {
  return props.registry.formContext as IJobFormContext;
}

/**
 * The machine, among the panel's enabled ones (and the one a repeated job named); names too long
 * for the box are cut by the select itself, whole in its title.
 */
function MachineWidget(props: WidgetProps): JSX.Element {
  const { trans, machines, pools, defaultMachine } = context(props);
  const value = String(props.value ?? '');
  const labelOf = (m: IMachine): string =>
    (m.builtin
      ? trans.__('This machine')
      : isOrganizations(m)
        ? `${m.name} (${m.kind}, ${trans.__('organization')})`
        : `${m.name} (${m.kind})`) +
    (m.enabled ? '' : ` — ${trans.__('disabled')}`);
  const chosen = machines.find(m => jobMachine(m) === value);
  return (
    <select
      id={props.id}
      className="jp-mod-styled jp-RemoteCompute-machinePicker"
      value={value}
      title={chosen ? labelOf(chosen) : value}
      aria-invalid={invalid(props)}
      disabled={props.disabled || props.readonly}
      onChange={e => props.onChange(e.target.value)}
    >
      {defaultMachine && (
        <option value={defaultMachine}>
          {trans.__(
            '%1 (the organization’s default)',
            defaultMachine.replace(/^org:/, '')
          )}
        </option>
      )}
      {machines.length === 0 && (
        <option value="local">{trans.__('This machine')}</option>
      )}
      {machines.map(m => (
        <option key={jobMachine(m)} value={jobMachine(m)} title={labelOf(m)}>
          {labelOf(m)}
        </option>
      ))}
      {pools.length > 0 && (
        <optgroup label={trans.__('Pools: the first machine with room')}>
          {pools.map(p => (
            <option key={`pool:${p.name}`} value={p.name}>
              {trans.__('%1 (pool of %2)', p.name, p.machines.join(', '))}
            </option>
          ))}
        </optgroup>
      )}
    </select>
  );
}

/**
 * A stored secret, by name; none: the machine's own. A repeated job's secret is offered even if
 * it is no longer stored: the server then says so.
 */
function SecretNameWidget(props: WidgetProps): JSX.Element {
  const { trans, secretNames } = context(props);
  const value = String(props.value ?? '');
  const names = [...new Set(value ? [...secretNames, value] : secretNames)];
  return (
    <select
      id={props.id}
      className="jp-mod-styled"
      value={value}
      aria-invalid={invalid(props)}
      disabled={props.disabled || props.readonly}
      onChange={e => props.onChange(e.target.value || undefined)}
    >
      <option value="">{trans.__('None')}</option>
      {names.map(name => (
        <option key={name} value={name}>
          {name}
        </option>
      ))}
    </select>
  );
}

/**
 * The form's own uiSchema; the runtime is asked only with an image.
 */
export function jobUiSchema(
  trans: TranslationBundle,
  hasImage: boolean
): FormUiSchema {
  const code = { 'ui:options': { classNames: 'jp-RemoteCompute-code' } };
  return {
    'ui:order': SHOWN,
    machine: {
      'ui:widget': MachineWidget,
      'ui:title': trans.__('Machine'),
      'ui:description': trans.__(
        'Where the job runs: this machine, or one added in the Compute panel.'
      )
    },
    command: {
      ...code,
      'ui:title': trans.__('Command'),
      'ui:description': trans.__(
        'One line for the machine’s shell, run in the job’s folder as written: `&&`, pipes and `$VARS` work, e.g. `python prepare.py && python train.py --epochs 3`'
      )
    },
    send: {
      'ui:title': trans.__('Files to send'),
      'ui:description': trans.__(
        'Workspace-relative files, folders or globs (`data/*.csv`), one per line.'
      )
    },
    bring_back: {
      'ui:title': trans.__('Files to bring back'),
      'ui:description': trans.__(
        'What the command writes and you want in the workspace (`model.pt`), one per line.'
      )
    },
    name: {
      'ui:title': trans.__('Name (optional)'),
      'ui:description': trans.__(
        'How the panel and the MLflow run call the job; empty: its command.'
      )
    },
    timeout: {
      'ui:title': trans.__('Timeout (optional)'),
      'ui:description': trans.__(
        'Seconds, or e.g. `30m`, `2h`; empty: no limit.'
      )
    },
    resources: {
      'ui:title': trans.__('Resources'),
      'ui:description': trans.__(
        'Per node. Leave a field empty to take the machine’s default. A machine that cannot give what is asked refuses the job.'
      ),
      'ui:options': { expanded: true },
      gpus: {
        'ui:title': trans.__('GPUs'),
        'ui:description': trans.__('e.g. 2')
      },
      cpus: {
        'ui:title': trans.__('CPUs'),
        'ui:description': trans.__('e.g. 8')
      },
      memory: {
        'ui:title': trans.__('Memory'),
        'ui:description': trans.__('e.g. `32G` or `512M`')
      },
      nodes: {
        'ui:title': trans.__('Nodes'),
        'ui:description': trans.__('e.g. 1')
      },
      partition: {
        'ui:title': trans.__('Partition'),
        'ui:description': trans.__('A scheduler’s partition, e.g. `gpu`')
      },
      processes_per_node: {
        'ui:title': trans.__('Processes per node'),
        'ui:description': trans.__(
          'Ranks of the command on each node, e.g. one per GPU (Slurm); each gets `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`.'
        )
      },
      launcher: {
        'ui:title': trans.__('Launcher'),
        'ui:description': trans.__(
          'How the processes start (Slurm): `torchrun` once per node, or `plain`, the command once per process.'
        )
      }
    },
    environment: {
      'ui:title': trans.__('Python environment and image'),
      'ui:description': trans.__(
        'Built once on the machine and reused while its content stays the same. Leave it empty for the machine’s default.'
      ),
      'ui:options': { expanded: true },
      requirements: {
        'ui:title': trans.__('Requirements file'),
        'ui:description': trans.__(
          'A workspace file: `requirements.txt`, `pyproject.toml` (with its `uv.lock`) or `pylock.toml`.'
        )
      },
      packages: {
        'ui:title': trans.__('Packages'),
        'ui:description': trans.__(
          'One requirement a line, e.g. `scikit-learn>=1.5`.'
        )
      },
      python: {
        'ui:title': trans.__('Python version'),
        'ui:description': trans.__('e.g. 3.11; empty: the machine’s python3.')
      },
      same_as_here: {
        'ui:title': trans.__('The same packages as this server’s Python'),
        'ui:description': trans.__(
          'The distributions of the Python this server runs, pinned.'
        )
      },
      image: {
        'ui:title': trans.__('Image'),
        'ui:description': trans.__(
          'A container image the command runs in (any machine but a Jupyter server), e.g. `nvidia/cuda:12.4.1-runtime-ubuntu22.04`; the environment above is built inside it. Empty: the machine’s default.'
        )
      },
      runtime: {
        'ui:title': trans.__('Container runtime'),
        'ui:description': trans.__('The image’s runtime; asked with an image.'),
        'ui:disabled': !hasImage,
        'ui:enumNames': [trans.__('podman, else docker'), 'podman', 'docker']
      }
    },
    registry_secret: {
      'ui:widget': SecretNameWidget,
      'ui:title': trans.__('Registry credentials'),
      'ui:description': trans.__(
        'A stored secret whose value is `user:password` (or `user:token`) for a private registry, used for the pull only. None: the machine’s `registry_secret`, if it has one.'
      )
    },
    env: {
      'ui:field': EnvRowsField,
      'ui:title': trans.__('Environment variables'),
      'ui:description': trans.__(
        'Type a value, or pick a stored secret: the job gets its value, and only its name is kept here. A typed value that looks like a secret is refused.'
      )
    }
  };
}
