/**
 * Agent machines in the panel: online or offline (last heartbeat), the token shown once, rotate and revoke.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';
import { CommandRegistry } from '@lumino/commands';
import * as React from 'react';

import { IMachine, requestAPI } from './api';
import { RelativeTime } from './components/common';
import { IKindFaces } from './kindFaces';
import { asAPIError, ComputeModel } from './model';

export const ROTATE_AGENT_TOKEN = 'remote-compute:rotate-agent-token';
export const REVOKE_AGENT_TOKEN = 'remote-compute:revoke-agent-token';

/**
 * What `GET /machines` says of an agent machine's agent.
 */
export interface IAgentPresence {
  online: boolean;
  /**
   * Epoch seconds of the agent's last call, or null if it never connected.
   */
  last_seen: number | null;
  connected: boolean;
  /**
   * Whether the machine has a token (false once revoked).
   */
  token: boolean;
}

/**
 * A new agent token and the command to run on the machine: shown once.
 */
export interface IAgentWelcome {
  agent_token: string;
  agent_command: string;
}

export function presenceOf(machine: IMachine): IAgentPresence | null {
  const agent = (machine as unknown as { agent?: IAgentPresence }).agent;
  return machine.kind === 'agent' && agent ? agent : null;
}

export function welcomeOf(saved: unknown): IAgentWelcome | null {
  const data = saved as Partial<IAgentWelcome> | null;
  return data && typeof data.agent_token === 'string'
    ? (data as IAgentWelcome)
    : null;
}

export function rotateAgentToken(name: string): Promise<IAgentWelcome> {
  return requestAPI<IAgentWelcome>(
    `machines/${encodeURIComponent(name)}/agent-token`,
    {
      method: 'POST',
      body: JSON.stringify({ action: 'rotate' }),
      headers: { 'Content-Type': 'application/json' }
    }
  );
}

export async function revokeAgentToken(name: string): Promise<void> {
  await requestAPI<unknown>(
    `machines/${encodeURIComponent(name)}/agent-token`,
    {
      method: 'POST',
      body: JSON.stringify({ action: 'revoke' }),
      headers: { 'Content-Type': 'application/json' }
    }
  );
}

/**
 * "online · heartbeat 3 s ago", "offline · last seen 2 h ago" or "never connected", beside the address.
 */
export function AgentPresence(props: {
  machine: IMachine;
  trans: TranslationBundle;
}): JSX.Element | null {
  const { machine, trans } = props;
  const presence = presenceOf(machine);
  if (!presence) {
    return null;
  }
  const seen = presence.last_seen;
  let text: React.ReactNode;
  if (!presence.token) {
    text = trans.__('no agent token');
  } else if (!seen) {
    text = trans.__('agent never connected');
  } else {
    text = (
      <RelativeTime
        when={seen}
        trans={trans}
        format={ago =>
          presence.online
            ? trans.__('online · heartbeat %1', ago)
            : trans.__('offline · last seen %1', ago)
        }
      />
    );
  }
  return (
    <span
      className="jp-RemoteCompute-agentPresence"
      data-online={presence.online ? 'true' : 'false'}
    >
      {' · '}
      {text}
    </span>
  );
}

/**
 * The token and the command to run, once; the server keeps only a hash.
 */
export async function showAgentWelcome(
  name: string,
  welcome: IAgentWelcome,
  trans: TranslationBundle
): Promise<void> {
  const body = (
    <div className="jp-RemoteCompute-agentWelcome">
      <p>
        {trans.__(
          'The agent token of %1, shown this once (only its hash is kept). Save it on that machine in ~/.config/jrc-agent.token with mode 600, then run there:',
          name
        )}
      </p>
      <pre className="jp-RemoteCompute-agentToken">{welcome.agent_token}</pre>
      <pre className="jp-RemoteCompute-agentCommand">
        {welcome.agent_command}
      </pre>
    </div>
  );
  await showDialog({
    title: trans.__('Agent token for %1', name),
    body,
    buttons: [Dialog.okButton({ label: trans.__('I saved it') })]
  });
}

export function registerAgentCommands(
  commands: CommandRegistry,
  model: ComputeModel,
  trans: TranslationBundle
): void {
  const isAgent = (args: { name?: unknown }): boolean =>
    typeof args.name === 'string' && model.machine(args.name)?.kind === 'agent';
  commands.addCommand(ROTATE_AGENT_TOKEN, {
    label: trans.__('Rotate Agent Token'),
    isVisible: args => isAgent(args),
    execute: async args => {
      const name = String(args.name);
      try {
        await showAgentWelcome(name, await rotateAgentToken(name), trans);
      } catch (error) {
        void showDialog({
          title: trans.__('Could not rotate the token of %1', name),
          body: asAPIError(error).message,
          buttons: [Dialog.okButton({ label: trans.__('OK') })]
        });
      }
      await model.refresh().catch(() => undefined);
    }
  });
  commands.addCommand(REVOKE_AGENT_TOKEN, {
    label: trans.__('Revoke Agent Token'),
    isVisible: args => isAgent(args),
    execute: async args => {
      const name = String(args.name);
      const result = await showDialog({
        title: trans.__('Revoke the agent token of %1?', name),
        body: trans.__(
          'The agent of %1 is let in no more until you rotate a new token.',
          name
        ),
        buttons: [
          Dialog.cancelButton({ label: trans.__('Cancel') }),
          Dialog.warnButton({ label: trans.__('Revoke') })
        ]
      });
      if (!result.button.accept) {
        return;
      }
      try {
        await revokeAgentToken(name);
      } catch (error) {
        void showDialog({
          title: trans.__('Could not revoke the token of %1', name),
          body: asAPIError(error).message,
          buttons: [Dialog.okButton({ label: trans.__('OK') })]
        });
      }
      await model.refresh().catch(() => undefined);
    }
  });
}

/**
 * The agent kind's part of the panel: its token commands in the machine's menu, its presence after
 * the address, the token shown once after an add.
 */
export const AGENT_FACES: IKindFaces = {
  machineCommands: [ROTATE_AGENT_TOKEN, REVOKE_AGENT_TOKEN],
  Beside: AgentPresence,
  afterAdd: (name, saved, trans) => {
    const welcome = welcomeOf(saved);
    if (welcome) {
      void showAgentWelcome(name, welcome, trans);
    }
  },
  registerCommands: registerAgentCommands
};
