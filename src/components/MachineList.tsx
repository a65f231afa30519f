/**
 * The panel's machines: the built-in one, the user's own, and the organization's, a row each, with
 * their actions as commands.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import {
  addIcon,
  closeIcon,
  editIcon,
  ellipsesIcon,
  ToolbarButtonComponent
} from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';
import { Menu } from '@lumino/widgets';
import * as React from 'react';

import { IMachine } from '../api';
import { facesOf } from '../kindFaces';
import { ComputeModel } from '../model';
import { KindIcon, RelativeTime } from './common';

/**
 * Edit, duplicate, remove: the machine's less frequent actions, as a menu of commands.
 */
function openMachineMenu(
  commands: CommandRegistry,
  name: string,
  anchor: HTMLElement | null,
  kind?: string,
  organization = false
): void {
  const menu = new Menu({ commands });
  menu.addClass('jp-RemoteCompute-menu');
  const items = organization
    ? ['remote-compute:edit-org-machine', 'remote-compute:remove-org-machine']
    : [
        'remote-compute:edit-machine',
        'remote-compute:duplicate-machine',
        ...(facesOf(kind).machineCommands ?? []),
        'remote-compute:remove-machine'
      ];
  for (const command of items) {
    menu.addItem({ command, args: { name } });
  }
  menu.aboutToClose.connect(() => {
    // Disposed after the click that closed it was handled.
    requestAnimationFrame(() => menu.dispose());
  });
  const rect = anchor?.getBoundingClientRect();
  menu.open(rect ? rect.left : 0, rect ? rect.bottom : 0);
}

export function MachineRow(props: {
  machine: IMachine;
  model: ComputeModel;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element {
  const { machine, model, commands, trans } = props;
  const check = model.lastCheck(machine.name);
  const kindLabel =
    model.kinds.find(k => k.kind === machine.kind)?.label || machine.kind;
  const displayName = machine.builtin ? trans.__('This machine') : machine.name;
  // The organization's machines are set by its admins in the hub's service: shown, not changed here,
  // except by an admin, whose changes and checks go to the service.
  const ours = isOrganizations(machine);
  const readOnly = ours && !model.isOrgAdmin;
  const args = { name: machine.name, organization: ours };
  const Beside = facesOf(machine.kind).Beside;
  return (
    <li
      className="jp-RemoteCompute-machine"
      data-enabled={machine.enabled ? 'true' : 'false'}
      aria-label={displayName}
    >
      <div className="jp-RemoteCompute-machineMain">
        <KindIcon kind={machine.kind} label={kindLabel} />
        {/* A long name is cut, whole in its title: the row's buttons stay in view. */}
        <span className="jp-RemoteCompute-itemName" title={displayName}>
          {displayName}
        </span>
        {!machine.builtin && !ours && (
          <label
            className="jp-RemoteCompute-switch"
            title={
              machine.enabled
                ? trans.__('Enabled: jobs may run on %1', machine.name)
                : trans.__('Disabled: no job runs on %1', machine.name)
            }
          >
            <input
              type="checkbox"
              role="switch"
              checked={machine.enabled}
              aria-label={trans.__('Enabled: %1', machine.name)}
              onChange={e =>
                void commands.execute('remote-compute:enable-machine', {
                  name: machine.name,
                  enabled: e.target.checked
                })
              }
            />
            {trans.__('Enabled')}
          </label>
        )}
        <span className="jp-RemoteCompute-rowActions">
          {!readOnly && (
            <button
              type="button"
              className="jp-RemoteCompute-checkButton"
              aria-label={trans.__('Check %1', displayName)}
              title={trans.__(
                'Check %1: connect, and read its facts (Python, GPUs, disk)',
                displayName
              )}
              onClick={() =>
                void commands.execute('remote-compute:check-machine', args)
              }
            >
              {trans.__('Check')}
            </button>
          )}
          {!machine.builtin && !readOnly && (
            <ToolbarButtonComponent
              icon={ellipsesIcon}
              tooltip={trans.__('More actions for %1', machine.name)}
              onClick={() => {
                const button = document.activeElement as HTMLElement | null;
                openMachineMenu(
                  commands,
                  machine.name,
                  button,
                  machine.kind,
                  ours
                );
              }}
            />
          )}
        </span>
      </div>
      <div className="jp-RemoteCompute-machineLine">
        <span className="jp-RemoteCompute-itemDetail jp-RemoteCompute-machineFacts">
          {ours && machine.admin && (
            <span
              className="jp-RemoteCompute-owner"
              title={trans.__(
                "The organization's machine, set by %1 in the hub's service",
                machine.admin
              )}
            >
              {trans.__('set by %1', machine.admin)}
              {' · '}
            </span>
          )}
          {ours && machine.access && (
            <span
              className="jp-RemoteCompute-access"
              title={trans.__(
                'Only these hub users and groups (and the admins) see and use it'
              )}
            >
              {trans.__(
                'for %1',
                [
                  ...(machine.access.users ?? []),
                  ...(machine.access.groups ?? []).map(g =>
                    trans.__('group %1', g)
                  )
                ].join(', ')
              )}
              {' · '}
            </span>
          )}
          <span className="jp-RemoteCompute-address" title={machine.address}>
            {machine.builtin
              ? trans.__('built in, always there')
              : machine.address}
          </span>
          {Beside && <Beside machine={machine} trans={trans} />}

          {machine.created && (
            <>
              {' · '}
              <RelativeTime
                when={machine.created}
                trans={trans}
                format={ago => trans.__('added %1', ago)}
              />
            </>
          )}
        </span>
      </div>
      {check && (
        <div
          className="jp-RemoteCompute-check"
          data-ok={check.ok ? 'true' : 'false'}
        >
          <RelativeTime
            when={check.at}
            trans={trans}
            title={check.ok ? JSON.stringify(check.facts) : check.message}
            format={ago =>
              check.ok
                ? trans.__('Check passed %1', ago)
                : trans.__('Check failed %1: %2', ago, check.message)
            }
          />
        </div>
      )}
    </li>
  );
}

export function Machines(props: {
  model: ComputeModel;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element {
  const { model, commands, trans } = props;
  const builtin = model.machines.filter(m => m.builtin);
  const others = model.machines.filter(m => !m.builtin && !isOrganizations(m));
  const organizations = model.machines.filter(isOrganizations);
  const rowProps = { model, commands, trans };
  return (
    <section
      className="jp-RemoteCompute-machines"
      aria-labelledby="jp-RemoteCompute-machines-heading"
    >
      <div className="jp-RemoteCompute-sectionHeader">
        <h3
          id="jp-RemoteCompute-machines-heading"
          className="jp-RemoteCompute-sectionTitle"
        >
          {trans.__('Machines')}
        </h3>
        <ToolbarButtonComponent
          icon={addIcon}
          label={trans.__('Add a Machine')}
          tooltip={trans.__(
            'Add a machine to run jobs on: SSH, Jupyter Server, Slurm, agent or SkyPilot'
          )}
          onClick={() => void commands.execute('remote-compute:add-machine')}
        />
      </div>
      <MachineList
        machines={builtin}
        className="jp-RemoteCompute-list jp-RemoteCompute-builtin"
        label={trans.__('Built-in machine')}
        {...rowProps}
      />
      {others.length > 0 && (
        <MachineList
          machines={others}
          className="jp-RemoteCompute-list"
          label={trans.__('Machines')}
          {...rowProps}
        />
      )}
      {others.length === 0 && organizations.length === 0 && (
        <EmptyMachines trans={trans} />
      )}
      {(model.pools.length > 0 || others.length > 0) && (
        <PoolList model={model} commands={commands} trans={trans} />
      )}
      {organizations.length > 0 && (
        <>
          <h4 className="jp-RemoteCompute-subsectionTitle">
            {trans.__('Organization')}
          </h4>
          <MachineList
            machines={organizations}
            className="jp-RemoteCompute-list"
            label={trans.__("The organization's machines")}
            {...rowProps}
          />
        </>
      )}
    </section>
  );
}

/**
 * One group of machines, a row each.
 */
export function MachineList(props: {
  machines: readonly IMachine[];
  className: string;
  label: string;
  model: ComputeModel;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element {
  const { machines, className, label, model, commands, trans } = props;
  return (
    <ul className={className} aria-label={label}>
      {machines.map(machine => (
        <MachineRow
          key={machine.name}
          machine={machine}
          model={model}
          commands={commands}
          trans={trans}
        />
      ))}
    </ul>
  );
}

function placementLabel(rule: string, trans: TranslationBundle): string {
  switch (rule) {
    case 'least_loaded':
      return trans.__('the least loaded');
    case 'cheapest':
      return trans.__('the cheapest');
    default:
      return trans.__('the first with room');
  }
}
/**
 * The workspace's pools: a job that names one goes to one of its machines by the pool's rule.
 */
function PoolList(props: {
  model: ComputeModel;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element {
  const { model, commands, trans } = props;
  return (
    <>
      <div className="jp-RemoteCompute-subsectionHeader">
        <h4 className="jp-RemoteCompute-subsectionTitle">
          {trans.__('Pools')}
        </h4>
        <ToolbarButtonComponent
          icon={addIcon}
          label={trans.__('New Pool')}
          tooltip={trans.__(
            'Machines a job may name as one: it runs on the first with room, or waits in line'
          )}
          onClick={() => void commands.execute('remote-compute:add-pool')}
        />
      </div>
      {model.pools.length > 0 && (
        <ul className="jp-RemoteCompute-list" aria-label={trans.__('Pools')}>
          {model.pools.map(pool => (
            <li
              key={pool.name}
              className="jp-RemoteCompute-item jp-RemoteCompute-pool"
              aria-label={trans.__('Pool %1', pool.name)}
            >
              <span className="jp-RemoteCompute-itemName" title={pool.name}>
                {pool.name}
              </span>
              <span className="jp-RemoteCompute-itemDetail">
                {trans.__(
                  '%1 · %2',
                  pool.machines.join(', '),
                  placementLabel(pool.placement, trans)
                )}
              </span>
              <ToolbarButtonComponent
                icon={editIcon}
                tooltip={trans.__('Edit pool %1', pool.name)}
                onClick={() =>
                  void commands.execute('remote-compute:edit-pool', {
                    name: pool.name
                  })
                }
              />
              <ToolbarButtonComponent
                icon={closeIcon}
                tooltip={trans.__('Remove pool %1', pool.name)}
                onClick={() =>
                  void commands.execute('remote-compute:remove-pool', {
                    name: pool.name
                  })
                }
              />
            </li>
          ))}
        </ul>
      )}
    </>
  );
}

/**
 * Whether a machine is the organization's (set in the hub's service), not this user's own.
 */
export function isOrganizations(machine: IMachine): boolean {
  return machine.owner === 'organization';
}

/**
 * The kinds of machine, one line each: what a newcomer picks from.
 */
function EmptyMachines(props: { trans: TranslationBundle }): JSX.Element {
  const { trans } = props;
  const kinds: [string, string][] = [
    [trans.__('SSH host'), trans.__('any machine you can ssh to')],
    [
      trans.__('Jupyter Server'),
      trans.__('a remote Jupyter or JupyterHub you have a token for')
    ],
    [
      trans.__('Slurm cluster'),
      trans.__("jobs wait in the cluster's queue (sbatch over ssh)")
    ],
    [
      trans.__('Agent'),
      trans.__('an on-prem machine that fetches its jobs from here')
    ],
    [
      trans.__('SkyPilot'),
      trans.__('your own cloud accounts: a cluster made for the job')
    ],
    [
      trans.__('This machine'),
      trans.__('already here: jobs run beside this server')
    ]
  ];
  return (
    <div className="jp-RemoteCompute-empty jp-RemoteCompute-emptyMachines">
      <p>{trans.__('No other machine yet. Add one of:')}</p>
      <ul aria-label={trans.__('Kinds of machine')}>
        {kinds.map(([kind, what]) => (
          <li key={kind}>
            <strong>{kind}</strong> — {what}
          </li>
        ))}
      </ul>
    </div>
  );
}
