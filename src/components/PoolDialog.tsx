/**
 * The pool dialog: a pool's name, its machines in order (the ones ticked), and its placement rule.
 * The server checks the pool (`PUT /pools/{name}`) and names what is wrong.
 */
import { Dialog, ReactWidget, showDialog } from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { IMachine, IPool } from '../api';

type Placement = IPool['placement'];

function PoolFields(props: {
  machines: readonly IMachine[];
  initial: IPool | null;
  onChange: (pool: IPool) => void;
  trans: TranslationBundle;
}): JSX.Element {
  const { machines, trans } = props;
  const [pool, setPool] = React.useState<IPool>(
    props.initial ?? { name: '', machines: [], placement: 'first' }
  );
  const change = (next: IPool): void => {
    setPool(next);
    props.onChange(next);
  };
  const toggle = (name: string, on: boolean): void =>
    change({
      ...pool,
      // Ticked machines keep the panel's order: the rule `first` takes them in it.
      machines: machines
        .map(m => m.name)
        .filter(n => (n === name ? on : pool.machines.includes(n)))
    });
  return (
    <div className="jp-RemoteCompute-poolFields">
      <label className="jp-RemoteCompute-field">
        <span>{trans.__('Name')}</span>
        <input
          className="jp-mod-styled"
          value={pool.name}
          disabled={!!props.initial}
          placeholder={trans.__('e.g. gpus')}
          onChange={e => change({ ...pool, name: e.target.value.trim() })}
        />
      </label>
      <fieldset className="jp-RemoteCompute-poolMachines">
        <legend>{trans.__('Machines')}</legend>
        {machines.map(m => (
          <label
            key={m.name}
            className="jp-RemoteCompute-field jp-RemoteCompute-fieldInline"
          >
            <input
              type="checkbox"
              checked={pool.machines.includes(m.name)}
              onChange={e => toggle(m.name, e.target.checked)}
            />
            {m.builtin ? trans.__('This machine (local)') : m.name}
          </label>
        ))}
      </fieldset>
      <label className="jp-RemoteCompute-field">
        <span>{trans.__('Placement')}</span>
        <select
          className="jp-mod-styled"
          value={pool.placement}
          onChange={e =>
            change({ ...pool, placement: e.target.value as Placement })
          }
        >
          <option value="first">{trans.__('The first with room')}</option>
          <option value="least_loaded">{trans.__('The least loaded')}</option>
          <option value="cheapest">
            {trans.__('The cheapest (its price_per_hour option)')}
          </option>
        </select>
      </label>
    </div>
  );
}

class PoolBody extends ReactWidget implements Dialog.IBodyWidget<IPool> {
  constructor(
    private _machines: readonly IMachine[],
    private _initial: IPool | null,
    private _trans: TranslationBundle
  ) {
    super();
    this._value = _initial ?? { name: '', machines: [], placement: 'first' };
  }

  getValue(): IPool {
    return this._value;
  }

  render(): JSX.Element {
    return (
      <PoolFields
        machines={this._machines}
        initial={this._initial}
        onChange={pool => {
          this._value = pool;
        }}
        trans={this._trans}
      />
    );
  }

  private _value: IPool;
}

/**
 * Ask for a pool (a new one, or `initial`'s machines and rule); null when cancelled.
 */
export async function askPool(
  machines: readonly IMachine[],
  initial: IPool | null,
  trans: TranslationBundle
): Promise<IPool | null> {
  const result = await showDialog({
    title: initial
      ? trans.__('Edit Pool %1', initial.name)
      : trans.__('New Pool'),
    body: new PoolBody(machines, initial, trans),
    buttons: [
      Dialog.cancelButton({ label: trans.__('Cancel') }),
      Dialog.okButton({ label: trans.__('Save') })
    ]
  });
  return result.button.accept ? result.value : null;
}
