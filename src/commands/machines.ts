/**
 * The machines' commands: add, edit, duplicate, remove, enable, check (and trust a host key); and
 * the pools': new, edit, remove.
 */
import { Notification } from '@jupyterlab/apputils';
import {
  addIcon,
  closeIcon,
  copyIcon,
  deleteIcon,
  editIcon
} from '@jupyterlab/ui-components';
import { ReadonlyJSONValue } from '@lumino/coreutils';

import {
  deletePool,
  IPool,
  putPool,
  removeMachine,
  removeOrgMachine,
  trustMachine,
  updateMachine
} from '../api';
import { isOrganizations } from '../components/MachineList';
import { askPool } from '../components/PoolDialog';
import {
  confirmRemoveMachine,
  confirmRemovePool,
  confirmTrustHost,
  ICheckFailure,
  showCheckFailure,
  showError
} from '../dialogs';
import { formatFacts } from '../facts';
import { asAPIError } from '../model';
import { CommandIDs, ICommandContext, stringArg } from './context';
import { Openers } from './openers';

export function registerMachineCommands(
  context: ICommandContext,
  openers: Openers
): void {
  const { app, model, trans } = context;
  const { commands } = app;

  commands.addCommand(CommandIDs.addMachine, {
    label: trans.__('Add a Machine'),
    caption: trans.__('Add an SSH host or a Jupyter Server to run jobs on'),
    icon: args => (args.isToolbar ? addIcon : undefined),
    execute: () => {
      void model.refresh().catch(() => undefined);
      openers.machineForm('add');
    }
  });

  // Pools: a job names one where it names a machine (docs/architecture/pools.md).
  const savePool = async (initial: IPool | null): Promise<void> => {
    const pool = await askPool(
      model.machines.filter(m => !isOrganizations(m)),
      initial,
      trans
    );
    if (!pool) {
      return;
    }
    try {
      await putPool(pool);
      await model.refresh();
    } catch (error) {
      showError(trans.__('Could not save pool %1', pool.name), error, trans);
    }
  };
  commands.addCommand(CommandIDs.addPool, {
    label: trans.__('New Pool'),
    caption: trans.__(
      'Machines a job may name as one: it runs on the first with room'
    ),
    icon: args => (args.isToolbar ? addIcon : undefined),
    execute: () => savePool(null)
  });
  commands.addCommand(CommandIDs.editPool, {
    label: args => trans.__('Edit Pool %1', stringArg(args, 'name')),
    icon: editIcon,
    isEnabled: args =>
      model.pools.some(p => p.name === stringArg(args, 'name')),
    execute: args =>
      savePool(
        model.pools.find(p => p.name === stringArg(args, 'name')) ?? null
      )
  });
  commands.addCommand(CommandIDs.removePool, {
    label: args => trans.__('Remove Pool %1', stringArg(args, 'name')),
    icon: closeIcon,
    execute: async args => {
      const name = stringArg(args, 'name');
      if (!(await confirmRemovePool(name, trans))) {
        return;
      }
      try {
        await deletePool(name);
        await model.refresh();
      } catch (error) {
        showError(trans.__('Could not remove pool %1', name), error, trans);
      }
    }
  });

  commands.addCommand(CommandIDs.editMachine, {
    label: args =>
      args.name
        ? trans.__('Edit Machine %1', stringArg(args, 'name'))
        : trans.__('Edit Machine'),
    icon: editIcon,
    isEnabled: args => {
      const machine = model.machine(stringArg(args, 'name'));
      return !!machine && !machine.builtin;
    },
    execute: args => {
      openers.machineForm('edit', stringArg(args, 'name'));
    }
  });

  commands.addCommand(CommandIDs.duplicateMachine, {
    label: args =>
      args.name
        ? trans.__('Duplicate Machine %1', stringArg(args, 'name'))
        : trans.__('Duplicate Machine'),
    icon: copyIcon,
    isEnabled: args => {
      const machine = model.machine(stringArg(args, 'name'));
      return !!machine && !machine.builtin;
    },
    execute: args => {
      openers.machineForm('add', stringArg(args, 'name'));
    }
  });

  commands.addCommand(CommandIDs.removeMachine, {
    label: args =>
      args.name
        ? trans.__('Remove Machine %1', stringArg(args, 'name'))
        : trans.__('Remove Machine'),
    icon: deleteIcon,
    isEnabled: args => {
      const machine = model.machine(stringArg(args, 'name'));
      return !!machine && !machine.builtin;
    },
    execute: async args => {
      const name = stringArg(args, 'name');
      if (!(await confirmRemoveMachine(name, trans))) {
        return;
      }
      try {
        await removeMachine(name, model.version || undefined);
        model.forgetMachine(name);
      } catch (error) {
        showError(trans.__('Could not remove %1', name), error, trans);
      }
      await model.refresh().catch(() => undefined);
    }
  });

  // The organization's machines: an admin's, through the hub's service (which refuses anyone else).
  commands.addCommand(CommandIDs.addOrgMachine, {
    label: trans.__("Add an Organization's Machine"),
    caption: trans.__(
      'Add a machine every member may run jobs on, its credentials kept by the organization'
    ),
    icon: args => (args.isToolbar ? addIcon : undefined),
    isEnabled: () => model.isOrgAdmin,
    execute: () => {
      openers.machineForm('add', undefined, true);
    }
  });

  commands.addCommand(CommandIDs.editOrgMachine, {
    label: args =>
      trans.__("Edit the Organization's Machine %1", stringArg(args, 'name')),
    icon: editIcon,
    isEnabled: () => model.isOrgAdmin,
    execute: args => {
      openers.machineForm('edit', stringArg(args, 'name'), true);
    }
  });

  commands.addCommand(CommandIDs.removeOrgMachine, {
    label: args =>
      trans.__("Remove the Organization's Machine %1", stringArg(args, 'name')),
    icon: deleteIcon,
    isEnabled: () => model.isOrgAdmin,
    execute: async args => {
      const name = stringArg(args, 'name');
      if (!(await confirmRemoveMachine(name, trans, true))) {
        return;
      }
      try {
        await removeOrgMachine(name);
        model.forgetMachine(name);
      } catch (error) {
        showError(trans.__('Could not remove %1', name), error, trans);
      }
      await model.refresh().catch(() => undefined);
    }
  });

  commands.addCommand(CommandIDs.enableMachine, {
    label: args =>
      args.enabled === false
        ? trans.__('Disable Machine %1', stringArg(args, 'name'))
        : trans.__('Enable Machine %1', stringArg(args, 'name')),
    isEnabled: args => {
      const machine = model.machine(stringArg(args, 'name'));
      return !!machine && !machine.builtin;
    },
    execute: async args => {
      const name = stringArg(args, 'name');
      const enabled = args.enabled !== false;
      try {
        await updateMachine(name, {
          enabled,
          version: model.version || undefined
        });
      } catch (error) {
        showError(
          enabled
            ? trans.__('Could not enable %1', name)
            : trans.__('Could not disable %1', name),
          error,
          trans
        );
      }
      await model.refresh().catch(() => undefined);
    }
  });

  commands.addCommand(CommandIDs.checkMachine, {
    label: args =>
      args.name
        ? trans.__('Check Machine %1', stringArg(args, 'name'))
        : trans.__('Check Machine'),
    execute: async args => {
      const name = stringArg(args, 'name');
      // One of the organization's machines: checked by its service, with its credentials.
      const organization = args.organization === true;
      const id = Notification.emit(
        trans.__('Checking %1…', name),
        'in-progress',
        { autoClose: false }
      );
      // The answer replaces the "Checking…" notification rather than updating it: an update
      // that arrives before the first toast is on screen is dropped by the toast layer (under
      // load that can take over a second), a dismissal is not.
      const answer = (
        message: string,
        type: Notification.TypeOptions,
        options: Notification.IOptions<ReadonlyJSONValue>
      ): void => {
        Notification.dismiss(id);
        Notification.emit(message, type, options);
      };
      // The whole answer, and the machine's form to fix it (not for the built-in machine).
      const details = (failure: ICheckFailure) => ({
        label: trans.__('Details'),
        caption: trans.__('Show the whole answer and edit the machine'),
        callback: () => {
          void showCheckFailure(name, failure, trans).then(edit => {
            if (edit && model.machine(name)?.builtin === false) {
              openers.machineForm('edit', name, organization);
            }
          });
        }
      });
      try {
        const result = await model.check(name, organization);
        if (!result.ok) {
          // Unreachable is the check's answer, not a failed request: a failed check, with the reason.
          const reason = result.reason ?? '';
          answer(
            trans.__('%1 could not be reached: %2', name, reason),
            'error',
            {
              autoClose: false,
              actions: [details({ message: reason, code: 'unreachable' })]
            }
          );
          return false;
        }
        const facts = formatFacts(result.facts ?? {});
        answer(
          facts
            ? trans.__('%1 answered: %2', name, facts)
            : trans.__('%1 answered.', name),
          'success',
          { autoClose: 8000 }
        );
        return true;
      } catch (error) {
        const apiError = asAPIError(error);
        // The organization's known_hosts is its service's, not this server's to write.
        const hostKey =
          apiError.details?.can_trust && !organization
            ? apiError.details.host_key
            : undefined;
        const trustAction = hostKey
          ? [
              {
                label: trans.__('Trust this host'),
                caption: trans.__(
                  'Compare the fingerprint, then record the key in known_hosts'
                ),
                callback: () => {
                  void confirmTrustHost(name, hostKey, trans).then(
                    async trusted => {
                      if (!trusted) {
                        return;
                      }
                      try {
                        const trusted = await trustMachine(
                          name,
                          hostKey.fingerprint
                        );
                        if (!trusted.trusted) {
                          Notification.error(
                            trans.__(
                              '%1 could not be reached: %2',
                              name,
                              trusted.reason ?? ''
                            )
                          );
                          return;
                        }
                        await commands.execute(CommandIDs.checkMachine, {
                          name
                        });
                      } catch (trustError) {
                        Notification.error(asAPIError(trustError).message);
                      }
                    }
                  );
                }
              }
            ]
          : [];
        // The server's message starts with the machine's name, which the toast already says.
        const said = apiError.message.startsWith(`${name}: `)
          ? apiError.message.slice(name.length + 2)
          : apiError.message;
        answer(trans.__('%1 could not be reached: %2', name, said), 'error', {
          autoClose: false,
          actions: [...trustAction, details(apiError)]
        });
        return false;
      }
    }
  });
}
