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
 * MLflow 3 shows an experiment as GenAI work (evaluations, traces, its assistant) or as model
 * training (runs, params, metrics), chosen by this query parameter of its page's route. A job is
 * training, so every address this module makes carries it.
 */
const MLFLOW_WORKFLOW_QUERY = 'workflowType=machine_learning';

function withWorkflow(route: string): string {
  return `${route}${route.includes('?') ? '&' : '?'}${MLFLOW_WORKFLOW_QUERY}`;
}

/**
 * Where the MLflow UI shows a run: `<url>/#/experiments/<exp>/runs/<id>` when the job
 * says which experiment, else `<url>/#/runs/<id>` (the UI finds the experiment); both in the
 * training view.
 */
export function mlflowRunUrl(
  base: string,
  runId: string,
  experimentId?: unknown
): string {
  const root = base.replace(/\/+$/, '');
  return withWorkflow(
    typeof experimentId === 'string' && experimentId
      ? `${root}/#/experiments/${encodeURIComponent(experimentId)}/runs/${encodeURIComponent(runId)}`
      : `${root}/#/runs/${encodeURIComponent(runId)}`
  );
}

/**
 * MLflow's run comparison of ``runIds``: `<url>/#/compare-runs?runs=[…]&experiments=[…]`, as
 * MLflow's own "Compare" button writes it (both lists JSON), in the training view.
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
  return withWorkflow(
    `${root}/#/compare-runs?runs=${runs}&experiments=${experiments}`
  );
}

/**
 * MLflow's list of experiments, in the training view.
 */
export function mlflowExperimentsUrl(base: string): string {
  return withWorkflow(base.replace(/\/*$/, '/') + '#/experiments');
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

/**
 * What MLflow 3's page reads from its origin's local storage as it loads (the keys as MLflow
 * 3.17's bundle names them; its hooks add `_v1` and store JSON, its dark mode stores a bare
 * "true"/"false").
 */
const MLFLOW_STORAGE = {
  darkMode: '_mlflow_dark_mode_toggle_enabled',
  // Which view a page without the query parameter opens in (links inside MLflow drop it).
  workflowType: 'mlflow.workflowType_v1',
  assistantOpen: 'mlflow.assistant.panelOpen_v1',
  // Its assistant opens itself on a first visit unless this says it already did.
  assistantAutoOpened: 'mlflow.assistant.fab.autoOpenedOnFirstLoad_v1'
} as const;

/**
 * Ready MLflow's page for a person training models, before it loads: the training view, its
 * assistant closed, and dark when the lab's theme is dark. MLflow's page is on this origin (the
 * proxy serves it), so it shares this storage; it reads it only as it loads.
 */
export function prepareMlflowPage(): void {
  const light = document.body.dataset.jpThemeLight;
  const entries: [string, string][] = [
    [MLFLOW_STORAGE.workflowType, JSON.stringify('machine_learning')],
    [MLFLOW_STORAGE.assistantOpen, JSON.stringify(false)],
    [MLFLOW_STORAGE.assistantAutoOpened, JSON.stringify(true)]
  ];
  if (light === 'true' || light === 'false') {
    entries.push([
      MLFLOW_STORAGE.darkMode,
      light === 'true' ? 'false' : 'true'
    ]);
  }
  try {
    for (const [key, value] of entries) {
      window.localStorage.setItem(key, value);
    }
  } catch {
    // Storage refused (a private window): MLflow keeps its own choices.
  }
}

/**
 * Keep an MLflow tab in the lab's theme: when the theme turns from light to dark or back, the
 * page is readied again and reloaded at the address it shows (MLflow reads its theme only as it
 * loads). Stops when the tab closes.
 */
function followLabTheme(widget: MainAreaWidget<IFrame>): void {
  let light = document.body.dataset.jpThemeLight;
  const observer = new MutationObserver(() => {
    const now = document.body.dataset.jpThemeLight;
    if (now === light) {
      return;
    }
    light = now;
    prepareMlflowPage();
    const page = widget.content.node.querySelector('iframe')?.contentWindow;
    try {
      page?.location.reload();
    } catch {
      // Not this origin's page any more (a link followed elsewhere): it keeps its theme.
    }
  });
  observer.observe(document.body, {
    attributes: true,
    attributeFilter: ['data-jp-theme-light']
  });
  widget.disposed.connect(() => observer.disconnect());
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
      : mlflowExperimentsUrl(base);
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
  prepareMlflowPage();
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
  followLabTheme(widget);
  app.shell.add(widget, 'main');
  app.shell.activateById(id);
}
