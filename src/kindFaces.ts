/**
 * What a kind adds to the panel beyond the machine UI every kind shares: the front-end side of the
 * server's `KindFaces` (engines/faces.py). The panel, the form and the commands read only this, so
 * no kind is named outside its own module.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { CommandRegistry } from '@lumino/commands';
import { Token } from '@lumino/coreutils';

import { IMachine } from './api';
import { ComputeModel } from './model';

export interface IKindFaces {
  /** Commands for a machine of this kind, in its menu between duplicate and remove (args: `{name}`). */
  readonly machineCommands?: readonly string[];
  /** What the machine's row shows after its address (an agent's presence). */
  readonly Beside?: (props: {
    machine: IMachine;
    trans: TranslationBundle;
  }) => JSX.Element | null;
  /** Called once with what the server answered when a machine of this kind was added. */
  readonly afterAdd?: (
    name: string,
    saved: unknown,
    trans: TranslationBundle
  ) => void;
  /** Registers the kind's own commands. */
  readonly registerCommands?: (
    commands: CommandRegistry,
    model: ComputeModel,
    trans: TranslationBundle
  ) => void;
}

/**
 * Where kinds declare what they add to the panel. The plugin provides it, so another extension's
 * plugin that adds a kind of machine on the server (an entry point in
 * `jupyter_remote_compute.faces`) can add that kind's faces here by requiring this token.
 */
export interface IKindFacesRegistry {
  /** Declares a kind's faces; a later call for the same kind replaces them. */
  register(kind: string, faces: IKindFaces): void;
  /** The faces of a kind; an empty set for a kind that adds nothing. */
  facesOf(kind: string | undefined): IKindFaces;
}

export const IKindFacesRegistry = new Token<IKindFacesRegistry>(
  'jupyter-remote-compute:IKindFacesRegistry',
  "What each kind of machine adds to the Compute panel: its machine commands, what its row shows, what follows an add. Require it to add a kind's faces."
);

const NONE: IKindFaces = {};

class KindFacesRegistry implements IKindFacesRegistry {
  register(kind: string, faces: IKindFaces): void {
    this._faces.set(kind, faces);
    // A kind declared after the commands were registered (another extension's plugin) gets its
    // own at once.
    if (this._commandsOf) {
      const { commands, model, trans } = this._commandsOf;
      faces.registerCommands?.(commands, model, trans);
    }
  }

  facesOf(kind: string | undefined): IKindFaces {
    return (kind && this._faces.get(kind)) || NONE;
  }

  /** Registers every declared kind's commands now, and each later one's as it is declared. */
  registerCommands(
    commands: CommandRegistry,
    model: ComputeModel,
    trans: TranslationBundle
  ): void {
    this._commandsOf = { commands, model, trans };
    for (const faces of this._faces.values()) {
      faces.registerCommands?.(commands, model, trans);
    }
  }

  private _faces = new Map<string, IKindFaces>();
  private _commandsOf: {
    commands: CommandRegistry;
    model: ComputeModel;
    trans: TranslationBundle;
  } | null = null;
}

/**
 * The one registry of this page: the plugin provides it as `IKindFacesRegistry`, the panel and the
 * forms read it.
 */
export const kindFaces = new KindFacesRegistry();

/** The faces of a kind; an empty set for a kind that adds nothing. */
export function facesOf(kind: string | undefined): IKindFaces {
  return kindFaces.facesOf(kind);
}
