/**
 * A picker of workspace files on JupyterLab's own file dialog, for the forms that name files (the
 * New Job form's requirements file, a pipeline node's files). Kept out of the pipeline's chunk,
 * which loads only when a pipeline is first opened.
 */
import { FileDialog } from '@jupyterlab/filebrowser';

/**
 * Workspace paths picked by the person, or none when the dialog was closed.
 */
export type PickFiles = (options: IPickOptions) => Promise<string[]>;

/**
 * What a requirements file may be: requirements.txt (or any .txt), pyproject.toml, pylock.toml.
 */
export const REQUIREMENTS_FILES = /\.(txt|toml)$/i;

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
