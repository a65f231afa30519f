/**
 * Environment variables as rows: a name, a value typed or a stored secret picked by name
 * (`secret:NAME`: the job gets its value, only its name is kept), and "Add a variable". The
 * secrets' names come through the form's context (`secretNames`); a value is never listed.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { Button } from '@jupyterlab/ui-components';
import { FieldProps } from '@rjsf/utils';
import * as React from 'react';

const SECRET_PREFIX = 'secret:';

/**
 * What the variables field reads from the form's context.
 */
export interface IEnvFieldContext {
  trans: TranslationBundle;
  secretNames: readonly string[];
}

type Row = { key: number; name: string; value: string };

function rowsOf(value: unknown): Row[] {
  const entries =
    typeof value === 'object' && value !== null && !Array.isArray(value)
      ? Object.entries(value as Record<string, unknown>)
      : [];
  return entries.map(([name, v], key) => ({ key, name, value: String(v) }));
}

function valueOf(rows: readonly Row[]): Record<string, string> {
  return Object.fromEntries(
    rows.filter(r => r.name.trim()).map(r => [r.name.trim(), r.value])
  );
}

/**
 * The rows are the person's while they type (a row without a name stays); the value is what
 * the rows with a name say.
 */
export function EnvRowsField(props: FieldProps): JSX.Element {
  const { trans, secretNames } = props.registry.formContext as IEnvFieldContext;
  const [rows, setRows] = React.useState<Row[]>(() => rowsOf(props.formData));
  const nextKey = React.useRef(rows.length);
  const disabled = props.disabled || props.readonly;
  const change = (next: Row[]): void => {
    setRows(next);
    props.onChange(valueOf(next));
  };
  const setRow = (key: number, patch: Partial<Row>): void =>
    change(rows.map(r => (r.key === key ? { ...r, ...patch } : r)));
  return (
    <div className="jp-RemoteCompute-envRows" id={props.idSchema.$id}>
      {rows.map(row => {
        const picked = row.value.startsWith(SECRET_PREFIX)
          ? row.value.slice(SECRET_PREFIX.length)
          : '';
        const shown = row.name || '…';
        return (
          <div key={row.key} className="jp-RemoteCompute-envRow">
            <input
              className="jp-mod-styled jp-RemoteCompute-code"
              type="text"
              aria-label={trans.__('Variable name')}
              placeholder={trans.__('NAME')}
              value={row.name}
              disabled={disabled}
              autoComplete="off"
              spellCheck={false}
              onChange={e => setRow(row.key, { name: e.target.value })}
            />
            <input
              className="jp-mod-styled jp-RemoteCompute-code"
              type="text"
              aria-label={trans.__('Value of %1', shown)}
              placeholder={trans.__('value')}
              value={row.value}
              disabled={disabled}
              autoComplete="off"
              spellCheck={false}
              onChange={e => setRow(row.key, { value: e.target.value })}
            />
            <select
              className="jp-mod-styled"
              aria-label={trans.__('Stored secret for %1', shown)}
              value={picked}
              disabled={disabled}
              onChange={e =>
                setRow(row.key, {
                  value: e.target.value
                    ? `${SECRET_PREFIX}${e.target.value}`
                    : ''
                })
              }
            >
              <option value="">{trans.__('Typed value')}</option>
              {secretNames.map(name => (
                <option key={name} value={name}>
                  {trans.__('Secret: %1', name)}
                </option>
              ))}
            </select>
            <Button
              type="button"
              minimal
              small
              disabled={disabled}
              aria-label={trans.__('Remove %1', shown)}
              onClick={() => change(rows.filter(r => r.key !== row.key))}
            >
              ✕
            </Button>
          </div>
        );
      })}
      {/* JupyterLab's secondary button: it reads as one, beside the accept button's Run */}
      <button
        type="button"
        className="jp-mod-styled jp-mod-reject jp-RemoteCompute-addRow"
        disabled={disabled}
        onClick={() =>
          setRows([...rows, { key: nextKey.current++, name: '', value: '' }])
        }
      >
        {trans.__('Add a variable')}
      </button>
    </div>
  );
}
