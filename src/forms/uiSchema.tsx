/**
 * How every form drawn from a JSON Schema looks and behaves (the New Job form, the machine form, a
 * pipeline step's settings): JupyterLab's own form component made to look like its settings
 * editor. No type pickers (a choice of scalars is one text field, `formSchema.ts`), each help text
 * once with its inline markdown rendered, lists of text as a box of lines rather than items with
 * buttons, groups of settings as sections, and no error before the server has answered (on Run or
 * Save), each shown on the field it names.
 */
import { FormComponent, IFormComponentProps } from '@jupyterlab/ui-components';
import { ReadonlyJSONObject } from '@lumino/coreutils';
import { ErrorSchema, RJSFSchema, UiSchema } from '@rjsf/utils';
import validator from '@rjsf/validator-ajv8';
import * as React from 'react';

import { fileUiSchema } from './fileFields';
import { CollapsedSection } from './FormSection';
import {
  CheckboxWidget,
  LinesField,
  SettingTemplate,
  TextWidget,
  VariablesField
} from './formTemplates';

export type FormUiSchema = UiSchema<ReadonlyJSONObject>;

// rjsf's validator is generic over the form's data; the lab's form names that type ReadonlyJSONObject.
const formValidator = validator as unknown as IFormComponentProps['validator'];

const TEMPLATES = { FieldTemplate: SettingTemplate };
const WIDGETS: NonNullable<IFormComponentProps['widgets']> = {
  CheckboxWidget: CheckboxWidget as unknown as NonNullable<
    IFormComponentProps['widgets']
  >[string],
  TextWidget
};

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * `b` laid over `a`, key by key inside objects (a field's widget and its title from two places).
 */
export function mergeUi(a: FormUiSchema, b: FormUiSchema): FormUiSchema {
  const out: Record<string, unknown> = { ...a };
  for (const [key, value] of Object.entries(b)) {
    out[key] =
      isPlainObject(out[key]) && isPlainObject(value)
        ? mergeUi(out[key] as FormUiSchema, value as FormUiSchema)
        : value;
  }
  return out as FormUiSchema;
}

/**
 * How the form draws the schema: lists of text as lines, variables as NAME=VALUE lines, pickers
 * on the settings naming workspace files, and each group of settings (the Python environment,
 * the resources) as a section of whatever fields the schema gives it; `own` is the form's own
 * (titles, help, order, widgets), laid over these.
 */
export function settingsUiSchema(
  schema: RJSFSchema | null,
  own: FormUiSchema = {}
): FormUiSchema {
  const ui: FormUiSchema = {
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
      ui[key] = {
        ...settingsUiSchema(prop),
        'ui:ObjectFieldTemplate': CollapsedSection
      };
      delete ui[key]['ui:submitButtonOptions'];
    }
  }
  const files = schema ? fileUiSchema(schema as Record<string, unknown>) : {};
  return mergeUi(mergeUi(ui, files), own);
}

/**
 * A problem the server named a setting for (`resources.memory`, `send[0]`, `env.TOKEN`), or none.
 */
export interface IFieldProblem {
  field?: string | null;
  message: string;
}

/**
 * The path of the form's field a problem belongs to: `resources.memory` on the memory field of
 * the resources section; `send[0]` or `env.TOKEN` on the setting itself (a list, the variables).
 * Empty: no field of the schema.
 */
export function problemPath(
  field: string | null | undefined,
  schema: RJSFSchema
): string[] {
  const path: string[] = [];
  let within: RJSFSchema | undefined = schema;
  for (const key of (field ?? '').split('[')[0].split('.')) {
    const inner: RJSFSchema | undefined = (
      within?.properties as Record<string, RJSFSchema> | undefined
    )?.[key];
    if (!inner) {
      break;
    }
    path.push(key);
    within = inner;
  }
  return path;
}

/**
 * The server's problems on the fields they name; one naming no field is the form's own.
 */
export function fieldErrors(
  problems: readonly IFieldProblem[],
  schema: RJSFSchema
): ErrorSchema {
  const errors: Record<string, unknown> = {};
  for (const problem of problems) {
    if (!problem.field) {
      continue;
    }
    let at = errors;
    for (const key of problemPath(problem.field, schema)) {
      at = (at[key] ??= {}) as Record<string, unknown>;
    }
    ((at.__errors ??= []) as string[]).push(problem.message);
  }
  return errors as ErrorSchema;
}

/**
 * A problem the server named a field for, with that field's place in the form.
 */
export type PlacedProblem = IFieldProblem & { path: string[] };

function valueAt(data: unknown, path: readonly string[]): unknown {
  return path.reduce<unknown>(
    (at, key) =>
      typeof at === 'object' && at !== null
        ? (at as Record<string, unknown>)[key]
        : undefined,
    data
  );
}

/**
 * The problems still standing after an edit: a field's problem goes when the field changes, the
 * others stay until the form is sent again.
 */
export function stillStanding(
  problems: readonly PlacedProblem[],
  before: unknown,
  after: unknown
): PlacedProblem[] {
  return problems.filter(
    p =>
      JSON.stringify(valueAt(after, p.path)) ===
      JSON.stringify(valueAt(before, p.path))
  );
}

/**
 * JupyterLab's form with the conventions above: no submit button of its own, no validation in the
 * browser (the server's answer is shown instead, through `extraErrors`), the settings editor's
 * field template and checkbox.
 */
export function SchemaForm(
  props: Omit<IFormComponentProps, 'validator'>
): JSX.Element {
  return (
    <FormComponent
      {...props}
      validator={formValidator}
      liveValidate={false}
      noValidate
      noHtml5Validate
      showErrorList={false}
      templates={TEMPLATES}
      widgets={{ ...WIDGETS, ...props.widgets }}
    />
  );
}
