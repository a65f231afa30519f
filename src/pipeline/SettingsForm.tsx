/**
 * A node's settings, in a form made from its step's JSON Schema; the server's problems with the
 * node (a missing or invalid setting) are shown on the field they name.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { ReadonlyJSONObject } from '@lumino/coreutils';
import { RJSFSchema } from '@rjsf/utils';
import * as React from 'react';

import { IPipelineProblem, IStep } from '../api';
import { IPipelineNode } from './document';
import { PickFiles } from '../filePicker';
import {
  formSchema,
  fromFormData,
  IFormSchema,
  toFormData
} from '../forms/formSchema';
import { InlineMarkdown } from '../forms/formTemplates';
import {
  fieldErrors,
  FormUiSchema,
  SchemaForm,
  settingsUiSchema
} from '../forms/uiSchema';

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
  const form: IFormSchema | null = React.useMemo(
    () => (step ? formSchema(step.settings) : null),
    [step]
  );
  const schema = form?.schema ?? null;
  const uiSchema = React.useMemo(
    (): FormUiSchema => settingsUiSchema(schema),
    [schema]
  );
  const formContext = React.useMemo(
    () => ({ pickFiles, trans }),
    [pickFiles, trans]
  );
  if (!step || !schema || !form) {
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
      className="jp-RemoteCompute-pipelineForm jp-RemoteCompute-schemaForm"
      role="region"
      aria-label={trans.__('Settings of %1', node.id)}
    >
      <h3>
        {node.id}: {step.label}
      </h3>
      {step.description && (
        <p className="jp-RemoteCompute-pipelineForm-help">
          <InlineMarkdown text={step.description} />
        </p>
      )}
      <SchemaForm
        // A new form per node: rjsf keeps its own state of the data it was given.
        key={node.id}
        idPrefix={`rc-pipeline-${node.id}`}
        schema={schema}
        formData={toFormData(node.settings, form) as ReadonlyJSONObject}
        extraErrors={fieldErrors(problems, schema)}
        readonly={props.readOnly}
        uiSchema={uiSchema}
        formContext={formContext}
        onChange={event => {
          props.onChange(
            withoutFilledDefaults(
              fromFormData(
                (event.formData ?? {}) as Record<string, unknown>,
                node.settings,
                form
              ),
              node.settings,
              schema
            )
          );
        }}
      />
    </div>
  );
}
