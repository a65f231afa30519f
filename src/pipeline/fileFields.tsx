/**
 * The settings that name workspace files (what a node sends, the notebook it runs, its
 * environment's requirements file) get a picker of the workspace's files beside the typed text:
 * JupyterLab's own file dialog, started at the pipeline's folder.
 */
import { FileDialog } from '@jupyterlab/filebrowser';
import { ReadonlyJSONObject } from '@lumino/coreutils';
import { TranslationBundle } from '@jupyterlab/translation';
import { FieldProps, UiSchema, WidgetProps } from '@rjsf/utils';
import * as React from 'react';

/**
 * What the form asks of the canvas: workspace paths picked by the person, or none when the
 * dialog was closed.
 */
export type PickFiles = (options: IPickOptions) => Promise<string[]>;

export interface IPickOptions {
  title: string;
  /**
   * Folders may be picked too (what a node sends may be a folder).
   */
  folders: boolean;
  /**
   * Only files whose name matches are shown (folders are always shown, to walk into).
   */
  accept?: RegExp;
}

/**
 * What a form's file fields share, through rjsf's form context.
 */
export interface IFileFieldContext {
  pickFiles: PickFiles | null;
  trans: TranslationBundle;
}

/**
 * A picker on JupyterLab's file dialog; `manager` is the file browser's document manager.
 */
export function filePicker(
  manager: FileDialog.IFileOptions['manager'],
  startAt: () => string
): PickFiles {
  return async options => {
    const defaultPath = startAt();
    const { accept } = options;
    const result = await FileDialog.getOpenFiles({
      manager,
      title: options.title,
      defaultPath,
      filter: model =>
        model.type === 'directory' || !accept || accept.test(model.name)
          ? {}
          : null
    });
    if (!result.button.accept || !result.value) {
      return [];
    }
    return (
      result.value
        // With nothing selected the dialog answers with the folder it shows: that is no pick.
        .filter(
          item =>
            item.type !== 'directory' ||
            (options.folders && item.path !== defaultPath)
        )
        .map(item => item.path)
    );
  };
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
 * A list of workspace paths: the usual list (typed entries, patterns such as data/*.csv) and
 * "Add files…", which appends the files and folders picked that the list does not hold yet.
 */
function WorkspaceFilesField(props: FieldProps): JSX.Element {
  const { pickFiles, trans } = context(props);
  const ArrayField = props.registry.fields.ArrayField;
  const label = String(props.schema.title || props.name);
  const current = Array.isArray(props.formData)
    ? (props.formData as unknown[])
    : [];
  return (
    <div className="jp-RemoteCompute-filesField">
      <ArrayField {...props} />
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
const REQUIREMENTS = /\.(txt|toml)$/i;

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
        'ui:options': { accept: REQUIREMENTS }
      }
    };
  }
  return ui;
}
