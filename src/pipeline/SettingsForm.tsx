/**
 * A node's settings, in a form made from its step's JSON Schema; the server's problems with the
 * node (a missing or invalid setting) are shown on the field they name.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { FormComponent, IFormComponentProps } from '@jupyterlab/ui-components';
import { ReadonlyJSONObject } from '@lumino/coreutils';
import { ErrorSchema, RJSFSchema } from '@rjsf/utils';
import validator from '@rjsf/validator-ajv8';
import * as React from 'react';

import { IPipelineProblem, IStep } from '../api';
import { IPipelineNode } from './document';
import { PickFiles } from '../filePicker';
import { fileUiSchema } from './fileFields';
import { CollapsedSection } from './FormSection';

/**
 * What a variant of a `oneOf` is, by its type, for the form's choice between them (rjsf would
 * say "option 1", "option 2").
 */
function variantTitle(variant: Record<string, unknown>): string | undefined {
  switch (variant.type) {
    case 'string':
      return 'text';
    case 'array':
      return 'list';
    case 'number':
    case 'integer':
      return 'number';
    case 'null':
      return 'none';
    default:
      return undefined;
  }
}

function titledVariants(
  schema: Record<string, unknown>
): Record<string, unknown> {
  const out: Record<string, unknown> = { ...schema };
  if (Array.isArray(schema.oneOf)) {
    out.oneOf = (schema.oneOf as Record<string, unknown>[]).map(v =>
      v.title || !variantTitle(v) ? v : { ...v, title: variantTitle(v) }
    );
  }
  const properties = schema.properties as
    Record<string, Record<string, unknown>> | undefined;
  if (properties) {
    out.properties = Object.fromEntries(
      Object.entries(properties).map(([k, v]) => [k, titledVariants(v)])
    );
  }
  return out;
}

/**
 * The schema as the form reads it: rjsf's validator (draft 07) has no meta-schema for 2020-12,
 * and needs none (the server validates against the schema as written).
 */
function formSchema(step: IStep): RJSFSchema {
  const schema = titledVariants(step.settings);
  delete schema.$schema;
  return schema as RJSFSchema;
}

// rjsf's validator is generic over the form's data; the lab's form names that type ReadonlyJSONObject.
const formValidator = validator as unknown as IFormComponentProps['validator'];

function isEmpty(value: unknown): boolean {
  return (
    value === undefined ||
    value === null ||
    (Array.isArray(value) && value.length === 0) ||
    (typeof value === 'object' &&
      value !== null &&
      Object.keys(value).length === 0)
  );
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * The settings without what the form filled in by itself: a setting the node did not have whose
 * value is empty (a none of a choice included) or the schema's default means the same to the
 * server, and would only mark the document changed because its form was opened. A group of
 * settings (the environment) is cleaned the same way inside.
 */
function withoutFilledDefaults(
  next: Record<string, unknown>,
  before: Record<string, unknown>,
  schema: RJSFSchema
): Record<string, unknown> {
  const properties = (schema.properties ?? {}) as Record<string, RJSFSchema>;
  const out: Record<string, unknown> = {};
  for (const [key, raw] of Object.entries(next)) {
    const inner = properties[key];
    const value =
      isPlainObject(raw) && inner?.properties
        ? withoutFilledDefaults(
            raw,
            isPlainObject(before[key]) ? before[key] : {},
            inner
          )
        : raw;
    const filled =
      !(key in before) &&
      (isEmpty(value) ||
        JSON.stringify(value) === JSON.stringify(inner?.default));
    if (!filled) {
      out[key] = value;
    }
  }
  return out;
}

/**
 * How the form draws the schema: pickers on the settings naming workspace files, and the Python
 * environment as a collapsed section of whatever fields the step's schema gives it.
 */
function formUiSchema(
  schema: RJSFSchema | null
): IFormComponentProps['uiSchema'] {
  const ui: NonNullable<IFormComponentProps['uiSchema']> = {
    ...(schema ? fileUiSchema(schema as Record<string, unknown>) : {}),
    'ui:submitButtonOptions': { norender: true }
  };
  const environment = (
    schema?.properties as Record<string, RJSFSchema> | undefined
  )?.environment;
  if (environment?.type === 'object') {
    ui.environment = {
      ...(ui.environment ?? {}),
      'ui:ObjectFieldTemplate': CollapsedSection
    };
  }
  return ui;
}

function fieldErrors(problems: IPipelineProblem[]): ErrorSchema {
  const errors: Record<string, unknown> = {};
  for (const problem of problems) {
    if (!problem.field) {
      continue;
    }
    const top = problem.field.split(/[.[]/)[0];
    const entry = (errors[top] ?? { __errors: [] }) as { __errors: string[] };
    entry.__errors.push(problem.message);
    errors[top] = entry;
  }
  return errors as ErrorSchema;
}

export function SettingsForm(props: {
  node: IPipelineNode;
  step: IStep | undefined;
  problems: IPipelineProblem[];
  readOnly: boolean;
  onChange: (settings: Record<string, unknown>) => void;
  /**
   * Pick workspace files for the settings that name them; null: the settings are typed only.
   */
  pickFiles: PickFiles | null;
  trans: TranslationBundle;
}): JSX.Element {
  const { node, step, problems, trans, pickFiles } = props;
  const schema = React.useMemo(() => (step ? formSchema(step) : null), [step]);
  const uiSchema = React.useMemo(
    (): IFormComponentProps['uiSchema'] => formUiSchema(schema),
    [schema]
  );
  const formContext = React.useMemo(
    () => ({ pickFiles, trans }),
    [pickFiles, trans]
  );
  if (!step || !schema) {
    return (
      <div className="jp-RemoteCompute-pipelineForm">
        <h3>{node.id}</h3>
        <p className="jp-RemoteCompute-errorDetail">
          {trans.__(
            'No installed package offers the step %1; its settings are kept as they are.',
            node.step
          )}
        </p>
        <pre>{JSON.stringify(node.settings, null, 2)}</pre>
      </div>
    );
  }
  return (
    <div
      className="jp-RemoteCompute-pipelineForm"
      role="region"
      aria-label={trans.__('Settings of %1', node.id)}
    >
      <h3>
        {node.id}: {step.label}
      </h3>
      {step.description && (
        <p className="jp-RemoteCompute-pipelineForm-help">{step.description}</p>
      )}
      <FormComponent
        // A new form per node: rjsf keeps its own state of the data it was given.
        key={node.id}
        idPrefix={`rc-pipeline-${node.id}`}
        schema={schema}
        formData={node.settings as ReadonlyJSONObject}
        validator={formValidator}
        liveValidate={false}
        showErrorList={false}
        extraErrors={fieldErrors(problems)}
        readonly={props.readOnly}
        uiSchema={uiSchema}
        formContext={formContext}
        onChange={event => {
          props.onChange(
            withoutFilledDefaults(
              (event.formData ?? {}) as Record<string, unknown>,
              node.settings,
              schema
            )
          );
        }}
      />
    </div>
  );
}
