/**
 * A group of settings drawn as a collapsed section of the form (a node's Python environment):
 * its title and a one-line summary of what is set, opened to show every field its schema gives.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { ObjectFieldTemplateProps } from '@rjsf/utils';
import * as React from 'react';

import { InlineMarkdown } from './formTemplates';

type Schema = Record<string, unknown>;

function describeValue(value: unknown, trans: TranslationBundle): string {
  if (Array.isArray(value)) {
    return value.length === 1
      ? String(value[0])
      : trans._n('%1 entry', '%1 entries', value.length);
  }
  if (typeof value === 'boolean') {
    return value ? trans.__('yes') : trans.__('no');
  }
  if (typeof value === 'object' && value !== null) {
    return Object.keys(value).join(', ');
  }
  return String(value);
}

function isSet(value: unknown): boolean {
  return !(
    value === undefined ||
    value === null ||
    value === '' ||
    value === false ||
    (Array.isArray(value) && value.length === 0) ||
    (typeof value === 'object' &&
      !Array.isArray(value) &&
      Object.keys(value).length === 0)
  );
}

/**
 * "Requirements file: requirements.txt · Python version: 3.11", in the schema's order and by its
 * titles; `none` when nothing is set.
 */
export function sectionSummary(
  schema: Schema,
  value: unknown,
  none: string,
  trans: TranslationBundle
): string {
  const data = (
    typeof value === 'object' && value !== null ? value : {}
  ) as Record<string, unknown>;
  const properties = (schema.properties ?? {}) as Record<string, Schema>;
  const keys = [
    ...Object.keys(properties),
    ...Object.keys(data).filter(k => !(k in properties))
  ];
  const parts = keys
    .filter(key => isSet(data[key]))
    .map(
      key =>
        `${String(properties[key]?.title ?? key)}: ${describeValue(data[key], trans)}`
    );
  return parts.length > 0 ? parts.join(' · ') : none;
}

function hasErrors(errors: unknown): boolean {
  if (typeof errors !== 'object' || errors === null) {
    return false;
  }
  return Object.entries(errors).some(([key, value]) =>
    key === '__errors'
      ? Array.isArray(value) && value.length > 0
      : hasErrors(value)
  );
}

/**
 * rjsf's template of an object setting, as a section: closed at first unless a field in it has
 * a problem or the form asks it open, then kept as the person leaves it.
 */
export function CollapsedSection(props: ObjectFieldTemplateProps): JSX.Element {
  const { trans } = props.registry.formContext as { trans: TranslationBundle };
  const schema = props.schema as Schema;
  const invalid = hasErrors(props.errorSchema);
  // A form whose sections are few and short opens them (`ui:options`: `expanded`).
  const [open, setOpen] = React.useState(
    invalid || props.uiSchema?.['ui:options']?.expanded === true
  );
  React.useEffect(() => {
    if (invalid) {
      setOpen(true);
    }
  }, [invalid]);
  const title =
    String(props.uiSchema?.['ui:title'] ?? '') ||
    props.title ||
    String(schema.title ?? '');
  const help =
    String(props.uiSchema?.['ui:description'] ?? '') ||
    (typeof schema.description === 'string' ? schema.description : '');
  // What an empty section means: the machine's default, unless the form says (`ui:options`: `none`).
  const none = props.uiSchema?.['ui:options']?.none;
  const summary = sectionSummary(
    schema,
    props.formData,
    typeof none === 'string' ? none : trans.__("the machine's default"),
    trans
  );
  return (
    <details
      id={props.idSchema.$id}
      className="jp-RemoteCompute-formSection"
      open={open}
      onToggle={event => setOpen((event.target as HTMLDetailsElement).open)}
    >
      <summary aria-label={trans.__('%1: %2', title, summary)}>
        <span className="jp-RemoteCompute-formSection-title">{title}</span>
        <span className="jp-RemoteCompute-formSection-summary">{summary}</span>
      </summary>
      {help && (
        <div className="jp-RemoteCompute-setting-help">
          <InlineMarkdown text={help} />
        </div>
      )}
      {props.properties.map(p => p.content)}
    </details>
  );
}
