/**
 * What a kind adds to the panel beyond the machine UI every kind shares: the front-end side of the
 * server's `KindFaces` (engines/faces.py). The panel, the form and the commands read only this, so
 * no kind is named outside its own module.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { CommandRegistry } from '@lumino/commands';

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

const registered = new Map<string, IKindFaces>();
const NONE: IKindFaces = {};

/** Declares a kind's faces (each kind's module calls it once, from the plugin's activation). */
export function registerKindFaces(kind: string, faces: IKindFaces): void {
  registered.set(kind, faces);
}

/** The faces of a kind; an empty set for a kind that adds nothing. */
export function facesOf(kind: string | undefined): IKindFaces {
  return (kind && registered.get(kind)) || NONE;
}

/** Every registered kind's faces, for the commands' registration. */
export function allKindFaces(): IKindFaces[] {
  return [...registered.values()];
}
