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
import {
  formSchema,
  fromFormData,
  IFormSchema,
  toFormData
} from './formSchema';
import {
  CheckboxWidget,
  InlineMarkdown,
  LinesField,
  SettingTemplate,
  VariablesField
} from './formTemplates';

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
 * How the form draws the schema: lists of text as lines, variables as NAME=VALUE lines, pickers
 * on the settings naming workspace files, and each group of settings (the Python environment,
 * the resources) as a collapsed section of whatever fields the step's schema gives it.
 */
function formUiSchema(
  schema: RJSFSchema | null
): IFormComponentProps['uiSchema'] {
  const ui: NonNullable<IFormComponentProps['uiSchema']> = {
    'ui:submitButtonOptions': { norender: true }
  };
  const properties = (schema?.properties ?? {}) as Record<string, RJSFSchema>;
  for (const [key, prop] of Object.entries(properties)) {
    if (
      prop.type === 'array' &&
      (prop.items as RJSFSchema)?.type === 'string'
    ) {
      ui[key] = { 'ui:field': LinesField };
    } else if (
      prop.type === 'object' &&
      !prop.properties &&
      (prop.additionalProperties as RJSFSchema | undefined)?.type === 'string'
    ) {
      ui[key] = { 'ui:field': VariablesField };
    } else if (prop.type === 'object' && prop.properties) {
      ui[key] = { 'ui:ObjectFieldTemplate': CollapsedSection };
    }
  }
  const files = schema ? fileUiSchema(schema as Record<string, unknown>) : {};
  for (const [key, entry] of Object.entries(files)) {
    ui[key] = { ...(ui[key] ?? {}), ...(entry as object) };
  }
  return ui;
}

const TEMPLATES = { FieldTemplate: SettingTemplate };
const WIDGETS = {
  CheckboxWidget: CheckboxWidget as unknown as NonNullable<
    IFormComponentProps['widgets']
  >[string]
};

/**
 * The server's problems on the fields they name: `resources.memory` on the memory field of the
 * resources section; `send[0]` or `env.TOKEN` on the setting itself (a list, the variables).
 */
function fieldErrors(
  problems: IPipelineProblem[],
  schema: RJSFSchema
): ErrorSchema {
  const errors: Record<string, unknown> = {};
  for (const problem of problems) {
    if (!problem.field) {
      continue;
    }
    let at = errors;
    let within: RJSFSchema | undefined = schema;
    for (const key of problem.field.split('[')[0].split('.')) {
      const inner: RJSFSchema | undefined = (
        within?.properties as Record<string, RJSFSchema> | undefined
      )?.[key];
      if (!inner) {
        break;
      }
      at = (at[key] ??= {}) as Record<string, unknown>;
      within = inner;
    }
    ((at.__errors ??= []) as string[]).push(problem.message);
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
  const form: IFormSchema | null = React.useMemo(
    () => (step ? formSchema(step.settings) : null),
    [step]
  );
  const schema = form?.schema ?? null;
  const uiSchema = React.useMemo(
    (): IFormComponentProps['uiSchema'] => formUiSchema(schema),
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
      className="jp-RemoteCompute-pipelineForm"
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
      <FormComponent
        // A new form per node: rjsf keeps its own state of the data it was given.
        key={node.id}
        idPrefix={`rc-pipeline-${node.id}`}
        schema={schema}
        formData={toFormData(node.settings, form) as ReadonlyJSONObject}
        validator={formValidator}
        liveValidate={false}
        showErrorList={false}
        extraErrors={fieldErrors(problems, schema)}
        readonly={props.readOnly}
        uiSchema={uiSchema}
        templates={TEMPLATES}
        widgets={WIDGETS}
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
