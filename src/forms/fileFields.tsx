/**
 * The settings that name workspace files (what a node sends, the notebook it runs, its
 * environment's requirements file) get a picker of the workspace's files beside the typed text:
 * JupyterLab's own file dialog, started at the pipeline's folder.
 */
import { ReadonlyJSONObject } from '@lumino/coreutils';
import { TranslationBundle } from '@jupyterlab/translation';
import { FieldProps, UiSchema, WidgetProps } from '@rjsf/utils';
import * as React from 'react';

import { PickFiles, REQUIREMENTS_FILES } from '../filePicker';
import { LinesField } from './formTemplates';

/**
 * What a form's file fields share, through rjsf's form context.
 */
export interface IFileFieldContext {
  pickFiles: PickFiles | null;
  trans: TranslationBundle;
}

function context(props: {
  registry: FieldProps['registry'];
}): IFileFieldContext {
  return props.registry.formContext as IFileFieldContext;
}

/**
 * A text setting naming one workspace file: the text box, and "Choose…" to pick it.
 */
function WorkspaceFileWidget(props: WidgetProps): JSX.Element {
  const { pickFiles, trans } = context(props);
  const TextWidget = props.registry.widgets.TextWidget;
  const accept = props.options.accept as RegExp | undefined;
  const label = String(props.label || props.schema.title || props.name);
  return (
    <div className="jp-RemoteCompute-fileField">
      <TextWidget {...props} />
      {pickFiles && (
        <button
          type="button"
          className="jp-mod-styled"
          disabled={props.disabled || props.readonly}
          aria-label={trans.__('Choose %1', label)}
          onClick={async () => {
            const [picked] = await pickFiles({
              title: trans.__('Choose %1', label),
              folders: false,
              accept
            });
            if (picked !== undefined) {
              props.onChange(picked);
            }
          }}
        >
          {trans.__('Choose…')}
        </button>
      )}
    </div>
  );
}

/**
 * A list of workspace paths: its lines (typed entries, patterns such as data/*.csv) and
 * "Add files…", which appends the files and folders picked that the list does not hold yet.
 */
function WorkspaceFilesField(props: FieldProps): JSX.Element {
  const { pickFiles, trans } = context(props);
  const label = String(
    props.uiSchema?.['ui:title'] || props.schema.title || props.name
  );
  const current = Array.isArray(props.formData)
    ? (props.formData as unknown[])
    : [];
  return (
    <div className="jp-RemoteCompute-filesField">
      <LinesField {...props} />
      {pickFiles && (
        <button
          type="button"
          className="jp-mod-styled jp-RemoteCompute-addFiles"
          disabled={props.disabled || props.readonly}
          aria-label={trans.__('Add files to %1', label)}
          onClick={async () => {
            const picked = await pickFiles({
              title: trans.__('Add to %1', label),
              folders: true
            });
            const added = picked.filter(p => !current.includes(p));
            if (added.length > 0) {
              props.onChange([...current, ...added]);
            }
          }}
        >
          {trans.__('Add files…')}
        </button>
      )}
    </div>
  );
}

/**
 * The settings of the product's steps that name workspace files, and what each accepts.
 * Another package's step gets the picker on a setting of the same name and shape.
 */
const FILE_SETTINGS: Record<string, RegExp | undefined> = {
  notebook: /\.ipynb$/i
};
const FILE_LIST_SETTINGS = new Set(['send']);

type Schema = Record<string, unknown>;

function properties(schema: Schema): Record<string, Schema> {
  return (schema.properties ?? {}) as Record<string, Schema>;
}

function isStringList(schema: Schema | undefined): boolean {
  return (
    schema?.type === 'array' && (schema.items as Schema)?.type === 'string'
  );
}

/**
 * The form's uiSchema entries for the file settings `schema` has (only those of the right type:
 * a setting of another shape is drawn as rjsf draws it).
 */
export function fileUiSchema(schema: Schema): UiSchema<ReadonlyJSONObject> {
  const ui: UiSchema<ReadonlyJSONObject> = {};
  for (const [key, prop] of Object.entries(properties(schema))) {
    if (key in FILE_SETTINGS && prop.type === 'string') {
      ui[key] = {
        'ui:widget': WorkspaceFileWidget,
        'ui:options': { accept: FILE_SETTINGS[key] }
      };
    } else if (FILE_LIST_SETTINGS.has(key) && isStringList(prop)) {
      ui[key] = { 'ui:field': WorkspaceFilesField };
    }
  }
  const requirements = properties(
    properties(schema).environment ?? {}
  ).requirements;
  if (requirements?.type === 'string') {
    ui.environment = {
      requirements: {
        'ui:widget': WorkspaceFileWidget,
        'ui:options': { accept: REQUIREMENTS_FILES }
      }
    };
  }
  return ui;
}
