/**
 * How a node's settings form draws a field, as JupyterLab's settings editor draws one: its label,
 * its help once (its inline markdown rendered), the input, and its problem under it. Lists of
 * text are a box of lines and variables a box of NAME=VALUE lines, as in the New Job form, so a
 * list has no per-item buttons and an added entry is never an empty item.
 */
import {
  ariaDescribedByIds,
  descriptionId,
  errorId,
  FieldProps,
  FieldTemplateProps,
  WidgetProps
} from '@rjsf/utils';
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

// `code`, **strong**, and [text](https://…): what the steps' help texts use.
const INLINE = /`([^`]+)`|\*\*([^*]+)\*\*|\[([^\]]+)\]\((https?:[^)\s]+)\)/g;

/**
 * A help text's inline markdown as elements; everything else is kept as text.
 */
export function InlineMarkdown(props: { text: string }): JSX.Element {
  const parts: React.ReactNode[] = [];
  let last = 0;
  for (const match of props.text.matchAll(INLINE)) {
    const at = match.index ?? 0;
    parts.push(props.text.slice(last, at));
    const [, code, strong, linkText, href] = match;
    if (code !== undefined) {
      parts.push(<code key={at}>{code}</code>);
    } else if (strong !== undefined) {
      parts.push(<strong key={at}>{strong}</strong>);
    } else {
      parts.push(
        <a key={at} href={href} target="_blank" rel="noopener noreferrer">
          {linkText}
        </a>
      );
    }
    last = at + match[0].length;
  }
  parts.push(props.text.slice(last));
  return <>{parts}</>;
}

/**
 * rjsf's template of one field. Groups (the root, a section) draw their own title and help; a
 * checkbox draws its label and help beside its box.
 */
export function SettingTemplate(props: FieldTemplateProps): JSX.Element {
  const { id, label, schema, children, rawErrors, hidden, required } = props;
  if (hidden) {
    return <div hidden>{children}</div>;
  }
  if (schema.type === 'object' && !props.uiSchema?.['ui:field']) {
    // The lab's field styles apply inside its form groups.
    return <div className="jp-FormGroup-content">{children}</div>;
  }
  const checkbox = schema.type === 'boolean';
  // The form's own help (its uiSchema's) before the schema's.
  const help = props.rawDescription || schema.description;
  const errors = (rawErrors ?? []).filter(Boolean);
  return (
    <div
      className={`jp-RemoteCompute-setting${errors.length ? ' jp-mod-error' : ''}`}
    >
      {!checkbox && label && (
        <div className="jp-RemoteCompute-setting-label">
          <label htmlFor={id}>{label}</label>
          {required && (
            // The input says it is required; the mark is for the eye only, beside the label.
            <span className="jp-RemoteCompute-setting-required" aria-hidden>
              {' *'}
            </span>
          )}
        </div>
      )}
      {!checkbox && help && (
        <div className="jp-RemoteCompute-setting-help" id={descriptionId(id)}>
          <InlineMarkdown text={help} />
        </div>
      )}
      <div className="jp-inputFieldWrapper">{children}</div>
      {errors.length > 0 && (
        <div
          className="jp-RemoteCompute-setting-error"
          id={errorId(id)}
          role="alert"
        >
          {errors.join(' ')}
        </div>
      )}
    </div>
  );
}

/**
 * rjsf's checkbox, with its label beside the box and its help under it (rjsf's own would put the
 * help above the box and the label after it).
 */
export function CheckboxWidget(props: {
  id: string;
  value: unknown;
  label: string;
  schema: { description?: string; title?: string };
  options?: { description?: unknown };
  disabled?: boolean;
  readonly?: boolean;
  onChange: (value: boolean) => void;
}): JSX.Element {
  const { id, schema } = props;
  const help = String(props.options?.description || schema.description || '');
  return (
    <div className="jp-RemoteCompute-setting-checkbox">
      <label htmlFor={id}>
        <input
          id={id}
          type="checkbox"
          checked={props.value === true}
          disabled={props.disabled || props.readonly}
          aria-describedby={ariaDescribedByIds(id)}
          onChange={event => props.onChange(event.target.checked)}
        />
        {props.label || schema.title}
      </label>
      {help && (
        <div className="jp-RemoteCompute-setting-help" id={descriptionId(id)}>
          <InlineMarkdown text={help} />
        </div>
      )}
    </div>
  );
}

/**
 * Whether the server named this field in its answer: the input says so to assistive technology.
 */
export function invalid(props: { rawErrors?: string[] }): boolean {
  return (props.rawErrors ?? []).some(Boolean);
}

/**
 * rjsf's text input, marked invalid while the server's problem with it stands.
 */
export function TextWidget(props: WidgetProps): JSX.Element {
  const { BaseInputTemplate } = props.registry.templates;
  return <BaseInputTemplate {...props} aria-invalid={invalid(props)} />;
}

/**
 * A box of lines for a value read from and written as text: the text is the person's while they
 * type (an empty line stays), and follows the value when it changes from outside (a picked file,
 * an undo).
 */
function LinesBox<T>(props: {
  field: FieldProps;
  read: (text: string) => T;
  write: (value: unknown) => string;
  same: (a: T, b: unknown) => boolean;
  placeholder: string;
}): JSX.Element {
  const { field, read, write, same } = props;
  const [text, setText] = React.useState(() => write(field.formData));
  React.useEffect(() => {
    if (!same(read(text), field.formData)) {
      setText(write(field.formData));
    }
    // Only a change of the value itself: the text is this box's own otherwise.
  }, [field.formData]);
  const id = field.idSchema.$id;
  return (
    <textarea
      id={id}
      className="jp-mod-styled jp-RemoteCompute-lines"
      rows={Math.min(8, Math.max(2, text.split('\n').length + 1))}
      value={text}
      placeholder={props.placeholder}
      spellCheck={false}
      disabled={field.disabled}
      readOnly={field.readonly}
      aria-describedby={ariaDescribedByIds(id)}
      aria-invalid={invalid({ rawErrors: field.errorSchema?.__errors })}
      onChange={event => {
        setText(event.target.value);
        field.onChange(read(event.target.value));
      }}
      onBlur={() => field.onBlur(id, text)}
    />
  );
}

function lines(text: string): string[] {
  return text
    .split('\n')
    .map(line => line.trim())
    .filter(line => line !== '');
}

function sameJSON(a: unknown, b: unknown): boolean {
  return JSON.stringify(a ?? null) === JSON.stringify(b ?? null);
}

/**
 * A list of text, one entry a line.
 */
export function LinesField(props: FieldProps): JSX.Element {
  const { trans } = props.registry.formContext as { trans: TranslationBundle };
  return (
    <LinesBox<string[]>
      field={props}
      read={lines}
      write={value => (Array.isArray(value) ? value.join('\n') : '')}
      same={(a, b) => sameJSON(a, Array.isArray(b) && b.length ? b : [])}
      placeholder={trans.__('One per line')}
    />
  );
}

/**
 * Variables, one NAME=VALUE a line (a line without `=` is a name with an empty value, which the
 * server then names if it is not a valid one).
 */
export function VariablesField(props: FieldProps): JSX.Element {
  const read = (text: string): Record<string, string> =>
    Object.fromEntries(
      lines(text).map(line => {
        const at = line.indexOf('=');
        return at < 0 ? [line, ''] : [line.slice(0, at), line.slice(at + 1)];
      })
    );
  return (
    <LinesBox<Record<string, string>>
      field={props}
      read={read}
      write={value =>
        typeof value === 'object' && value !== null
          ? Object.entries(value as Record<string, unknown>)
              .map(([k, v]) => `${k}=${String(v)}`)
              .join('\n')
          : ''
      }
      same={(a, b) =>
        sameJSON(a, b && Object.keys(b as object).length ? b : {})
      }
      placeholder={(
        props.registry.formContext as { trans: TranslationBundle }
      ).trans.__('NAME=VALUE, one per line')}
    />
  );
}
