/**
 * MLflow one click away: its own UI in a JupyterLab tab, at a job's run or at the experiment list.
 *
 * Where the UI is comes from the server (`GET /remote-compute/mlflow`): the tracking server's
 * address (opened in a browser tab, since a tracking server usually forbids being framed by
 * another origin), or the path under this Jupyter server that proxies the UI it runs for the
 * workspace's own store (opened in a JupyterLab tab; same origin, behind Jupyter's login).
 * A "MLflow UI URL" setting, if given, wins over both.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { MainAreaWidget } from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';
import { IFrame } from '@jupyterlab/ui-components';

import { requestAPI } from './api';
import { computeIcon } from './icons';

/**
 * `GET /remote-compute/mlflow`.
 */
export interface IMlflowUI {
  /**
   * The UI's root, ending in `/`: absolute for a tracking server, a server path when proxied.
   */
  url: string;
  proxied: boolean;
  running: boolean;
}

export function getMlflowUI(): Promise<IMlflowUI> {
  return requestAPI<IMlflowUI>('mlflow');
}

/**
 * Where the MLflow UI shows a run: `<url>/#/experiments/<exp>/runs/<id>` when the job
 * says which experiment, else `<url>/#/runs/<id>` (the UI finds the experiment).
 */
export function mlflowRunUrl(
  base: string,
  runId: string,
  experimentId?: unknown
): string {
  const root = base.replace(/\/+$/, '');
  return typeof experimentId === 'string' && experimentId
    ? `${root}/#/experiments/${encodeURIComponent(experimentId)}/runs/${encodeURIComponent(runId)}`
    : `${root}/#/runs/${encodeURIComponent(runId)}`;
}

/**
 * MLflow's run comparison of ``runIds``: `<url>/#/compare-runs?runs=[…]&experiments=[…]`, as
 * MLflow's own "Compare" button writes it (both lists JSON).
 */
export function mlflowCompareUrl(
  base: string,
  runIds: readonly string[],
  experimentId?: string
): string {
  const root = base.replace(/\/+$/, '');
  const runs = encodeURIComponent(JSON.stringify(runIds));
  const experiments = encodeURIComponent(
    JSON.stringify(experimentId ? [experimentId] : [])
  );
  return `${root}/#/compare-runs?runs=${runs}&experiments=${experiments}`;
}

/**
 * What to open: a run, runs to compare, or (neither) the experiment list.
 */
export interface IOpenMlflowOptions {
  runId?: string;
  experimentId?: string;
  /**
   * Runs to compare side by side (a sweep's trials), in MLflow's run comparison.
   */
  compareRunIds?: string[];
  /**
   * The tab's title (a job's name).
   */
  label?: string;
  /**
   * The "MLflow UI URL" setting; empty for the server's answer.
   */
  configuredUrl?: string;
  /**
   * The tracking server the run was recorded on, where it is not the workspace's (a job on the
   * organization's machine): its own UI, opened in a browser tab, whatever the two above say.
   */
  trackingServer?: string;
}

function safeId(text: string): string {
  return text.replace(/[^A-Za-z0-9_-]/g, '_');
}

// MLflow 3's own dark-mode switch, kept in its page's local storage ("true"/"false").
const MLFLOW_DARK_MODE_KEY = '_mlflow_dark_mode_toggle_enabled';

/**
 * MLflow's UI in the lab's theme: dark when the lab's theme is dark. It is read as MLflow loads, so
 * a tab already open keeps its theme until it is opened again.
 */
function followLabTheme(): void {
  const light = document.body.dataset.jpThemeLight;
  if (light === 'true' || light === 'false') {
    try {
      window.localStorage.setItem(
        MLFLOW_DARK_MODE_KEY,
        light === 'true' ? 'false' : 'true'
      );
    } catch {
      // Storage refused (a private window): MLflow keeps its own choice.
    }
  }
}

/**
 * Open MLflow's UI at a run or at the experiment list; one tab per run (or one for the list).
 */
export async function openMlflow(
  app: JupyterFrontEnd,
  trans: TranslationBundle,
  options: IOpenMlflowOptions
): Promise<void> {
  let base = options.trackingServer || options.configuredUrl || '';
  let proxied = false;
  if (!base) {
    const ui = await getMlflowUI();
    proxied = ui.proxied;
    // Proxied: a path on this origin that already holds the server's base URL.
    base = ui.url;
  }
  const url = options.compareRunIds?.length
    ? mlflowCompareUrl(base, options.compareRunIds, options.experimentId)
    : options.runId
      ? mlflowRunUrl(base, options.runId, options.experimentId)
      : base.replace(/\/*$/, '/') + '#/experiments';
  if (!proxied) {
    window.open(url, '_blank', 'noopener');
    return;
  }
  const tabOf = options.compareRunIds?.length
    ? `compare-${safeId(options.compareRunIds.join('-')).slice(0, 64)}`
    : options.runId;
  const id = tabOf
    ? `jp-remote-compute-mlflow-${safeId(tabOf)}`
    : 'jp-remote-compute-mlflow';
  for (const widget of app.shell.widgets('main')) {
    if (widget.id === id) {
      app.shell.activateById(id);
      return;
    }
  }
  // MLflow's page, on this origin, reads its theme from this origin's storage when it loads.
  followLabTheme();
  const frame = new IFrame({
    // MLflow's page is served from this origin by the proxy: it needs its scripts, its own
    // same-origin requests and its forms; links to elsewhere open as popups.
    sandbox: [
      'allow-scripts',
      'allow-same-origin',
      'allow-forms',
      'allow-popups',
      'allow-downloads'
    ],
    referrerPolicy: 'same-origin'
  });
  frame.url = url;
  frame.addClass('jp-RemoteCompute-mlflowFrame');
  const widget = new MainAreaWidget({ content: frame });
  widget.id = id;
  widget.title.icon = computeIcon;
  widget.title.closable = true;
  widget.title.label = tabOf
    ? trans.__('MLflow: %1', options.label || tabOf.slice(0, 8))
    : trans.__('MLflow');
  widget.title.caption = url;
  app.shell.add(widget, 'main');
  app.shell.activateById(id);
}
