/**
 * From a job to its MLflow run in one click, and a running job's detail laid out whole:
 * MLflow's own UI (started by the server for the workspace's sqlite store) in a JupyterLab tab,
 * in its Model training view and the lab's theme, and two live charts above a log that keeps to
 * its end.
 *
 * With UPDATE_SCREENSHOTS=1 the screenshots go to docs/screenshots/ (job-detail-light.png,
 * job-detail-dark.png, mlflow-in-a-tab.png).
 */
import { expect, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import { FrameLocator } from '@playwright/test';
import * as path from 'path';

import { api, unique } from './helpers';

const WORKSPACE = path.join(process.env.REMOTE_COMPUTE_UI_TMP ?? '', 'workspace');
const OUT = process.env.UPDATE_SCREENSHOTS
  ? path.resolve(__dirname, '..', '..', 'docs', 'screenshots')
  : path.resolve(__dirname, '..', 'test-results', 'screenshots');

// Logs a param and a metric, ends: the run the product records carries it.
const TRAIN = `import mlflow
with mlflow.start_run():
    mlflow.log_param("learning_rate", 0.01)
    for step in range(4):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
print("trained", flush=True)
`;

// Thirty log lines and two metrics, then waits for the go file named in argv: a running job.
const LIVE = `import os, sys, time
import mlflow
with mlflow.start_run():
    for step in range(30):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
        mlflow.log_metric("accuracy", 0.5 + step / 60, step=step)
        print(f"epoch {step:02d} loss={1.0 / (step + 1):.4f}", flush=True)
        time.sleep(0.05)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
print("done", flush=True)
`;

async function jobWith(page: IJupyterLabPageFixture, id: string, done: (job: any) => boolean): Promise<any> {
  let job: any = null;
  await expect
    .poll(
      async () => {
        job = await api(page, 'GET', `jobs/${id}`);
        return done(job);
      },
      { timeout: 120000 }
    )
    .toBe(true);
  return job;
}

/**
 * MLflow's page in the frame shows the job's run where a person training a model looks for it:
 * under the experiment's training runs (not its GenAI evaluations), with its param and metric,
 * MLflow's assistant a closed button, dark exactly when asked.
 */
async function expectTrainingRun(frame: FrameLocator, name: string, dark: boolean): Promise<void> {
  // MLflow's UI starts on first use: its imports take a while on a busy machine.
  await expect(frame.getByRole('heading', { name })).toBeVisible({ timeout: 180000 });
  // The breadcrumb "<experiment> › Runs"; the GenAI view's reads "<experiment> › Evaluations".
  await expect(frame.locator('[data-testid="experiment-observatory-link-runs"]')).toHaveText('Runs');
  await expect(frame.getByText('Parameters (1)', { exact: true })).toBeVisible({ timeout: 60000 });
  await expect(frame.getByRole('row', { name: /learning_rate\s*0\.01/ })).toBeVisible();
  await expect(frame.getByRole('row', { name: /loss\s*0\.25/ })).toBeVisible();
  await expect(frame.getByText('Evaluations', { exact: true })).toHaveCount(0);
  await expect(frame.getByText('Evaluation runs', { exact: true })).toHaveCount(0);
  // The assistant's button is drawn only while its panel is closed (and after its first-visit opening).
  await expect(frame.getByRole('button', { name: 'MLflow Assistant' })).toBeVisible();
  await expect(frame.getByText(/Ask questions about your/)).toHaveCount(0);
  await expect(frame.locator('body.dark-mode')).toHaveCount(dark ? 1 : 0);
}

test.use({ autoGoto: true, viewport: { width: 1280, height: 1200 } });

test.describe('MLflow one click away', () => {
  for (const theme of ['light', 'dark']) {
    test(`Open in MLflow shows a finished job's run as a training run in the ${theme} theme`, async ({
      page,
      tmpPath
    }) => {
      test.setTimeout(300000);
      const dark = theme === 'dark';
      if (dark) {
        await page.theme.setDarkTheme();
      }
      const name = unique('ui-mlflow');
      await page.contents.uploadContent(TRAIN, 'text', `${tmpPath}/train.py`);
      const { job } = await api(page, 'POST', 'jobs', {
        machine: 'local',
        command: `python ${tmpPath}/train.py`,
        send: [`${tmpPath}/train.py`],
        name
      });
      const ended = await jobWith(page, job.id, j => j.state === 'succeeded' && !!j.mlflow_run_id);
      const where = await api(page, 'GET', 'mlflow');
      expect(where.proxied).toBe(true);

      await page.sidebar.openTab('jp-remote-compute-panel');
      const panel = page.locator('#jp-remote-compute-panel');
      const row = panel.getByRole('listitem', { name });
      await expect(row).toContainText('succeeded', { timeout: 60000 });

      // The job list's menu has it too.
      await row.click({ button: 'right' });
      await expect(page.getByRole('menuitem', { name: 'Open in MLflow' })).toBeEnabled();
      await page.keyboard.press('Escape');

      await row.click();
      const detail = page.getByRole('region', { name: `Job ${name}` });
      await expect(detail.getByRole('link', { name: ended.mlflow_run_id })).toBeVisible();
      await detail.getByRole('button', { name: 'Open in MLflow' }).click();

      const tab = page.getByRole('tab', { name: new RegExp(`MLflow: ${name}`) });
      await expect(tab).toBeVisible();
      const frame = page.frameLocator('.jp-RemoteCompute-mlflowFrame iframe');
      await expectTrainingRun(frame, name, dark);

      if (!dark) {
        for (const button of await page.getByRole('button', { name: 'Hide notification' }).all()) {
          await button.click({ timeout: 1000 }).catch(() => undefined);
        }
        await page.locator('#jp-main-dock-panel').screenshot({
          path: path.join(OUT, 'mlflow-in-a-tab.png'),
          style: '.Toastify { display: none !important; }'
        });
      }

      // The open tab follows the lab's theme when it changes, still at the run in the training view.
      if (dark) {
        await page.theme.setLightTheme();
      } else {
        await page.theme.setDarkTheme();
      }
      await expectTrainingRun(frame, name, !dark);
      if (!dark) {
        await page.theme.setLightTheme();
      }
    });
  }

  test('Open MLflow lists the experiments, and one opens on its training runs', async ({ page, tmpPath }) => {
    test.setTimeout(300000);
    const name = unique('ui-mlflow-list');
    await page.contents.uploadContent(TRAIN, 'text', `${tmpPath}/train.py`);
    const { job } = await api(page, 'POST', 'jobs', {
      machine: 'local',
      command: `python ${tmpPath}/train.py`,
      send: [`${tmpPath}/train.py`],
      name
    });
    await jobWith(page, job.id, j => j.state === 'succeeded' && !!j.mlflow_run_id);
    await page.evaluate(async () => {
      await (window as any).jupyterapp.commands.execute('remote-compute:open-mlflow', {});
    });
    await expect(page.getByRole('tab', { name: 'MLflow', exact: true })).toBeVisible();
    const frame = page.frameLocator('.jp-RemoteCompute-mlflowFrame iframe');
    await expect(frame.getByRole('link', { name: 'Default', exact: true })).toBeVisible({ timeout: 180000 });
    await frame.getByRole('link', { name: 'Default', exact: true }).click();
    // The experiment's training runs: its runs table with the job's run; no GenAI pages, assistant closed.
    await expect(frame.getByRole('link', { name })).toBeVisible({ timeout: 60000 });
    await expect(frame.getByText(/^\d+ matching runs?$/)).toBeVisible();
    await expect(frame.getByText('Evaluation runs', { exact: true })).toHaveCount(0);
    await expect(frame.getByRole('button', { name: 'MLflow Assistant' })).toBeVisible();
    await expect(frame.getByText(/Ask questions about your/)).toHaveCount(0);
  });

  test("a running job's detail: both charts whole, the log at its end", async ({ page, tmpPath }) => {
    test.setTimeout(300000);
    const name = unique('ui-live2');
    const go = path.join(WORKSPACE, tmpPath, 'go');
    await page.contents.uploadContent(LIVE, 'text', `${tmpPath}/live.py`);
    const { job } = await api(page, 'POST', 'jobs', {
      machine: 'local',
      command: `python ${tmpPath}/live.py ${go}`,
      send: [`${tmpPath}/live.py`],
      name,
      timeout: 14400,
      resources: { cpus: 1, memory: '1G' }
    });
    await page.sidebar.openTab('jp-remote-compute-panel');
    const panel = page.locator('#jp-remote-compute-panel');
    await panel.getByRole('listitem', { name }).click();

    const detail = page.getByRole('region', { name: `Job ${name}` });
    const metrics = detail.getByRole('region', { name: 'Live metrics' });
    const loss = metrics.getByRole('img', { name: /^loss: 30 points, last 0\.03333 at step 29$/ });
    const accuracy = metrics.getByRole('img', { name: /^accuracy: 30 points, last 0\.9833 at step 29$/ });
    await expect(loss).toBeVisible({ timeout: 120000 });
    await expect(accuracy).toBeVisible({ timeout: 60000 });
    const log = page.getByRole('log', { name: /Log of job/ });
    await expect(log).toContainText('epoch 29', { timeout: 60000 });
    await expect(detail.getByText('running', { exact: true })).toBeVisible();
    await expect(detail.getByText('4h00m', { exact: true })).toBeVisible();
    await expect(detail.getByText('1 CPU · 1G memory', { exact: true })).toBeVisible();

    // Whole: each chart's box ends above the log pane, and the detail can scroll to all of it.
    const logBox = await page.locator('.jp-RemoteCompute-jobDetail .jp-RemoteCompute-logView').boundingBox();
    for (const chart of [loss, accuracy]) {
      await chart.scrollIntoViewIfNeeded();
      const box = await chart.boundingBox();
      const logNow = await page.locator('.jp-RemoteCompute-jobDetail .jp-RemoteCompute-logView').boundingBox();
      expect(box && logNow && box.height > 80 && box.y + box.height <= logNow.y).toBeTruthy();
      await expect(chart.locator('text', { hasText: 'step' })).toHaveCount(1);
    }
    expect(logBox).not.toBeNull();

    // At its end: the last line in view, the scroller at its bottom.
    await log.scrollIntoViewIfNeeded();
    await expect(log.getByText('epoch 29')).toBeInViewport();
    const atEnd = await log.evaluate(el => el.scrollTop + el.clientHeight >= el.scrollHeight - 20);
    expect(atEnd).toBe(true);

    for (const button of await page.getByRole('button', { name: 'Hide notification' }).all()) {
      await button.click({ timeout: 1000 }).catch(() => undefined);
    }
    await page.mouse.move(1200, 10);
    const main = page.locator('#jp-main-dock-panel');
    const style = '.Toastify { display: none !important; }';
    await detail.evaluate(el => el.closest('.jp-RemoteCompute-jobDetail')?.scrollTo(0, 0));
    await main.screenshot({ path: path.join(OUT, 'job-detail-light.png'), style });
    await page.theme.setDarkTheme();
    await expect(page.locator('body')).toHaveAttribute('data-jp-theme-light', 'false');
    await main.screenshot({ path: path.join(OUT, 'job-detail-dark.png'), style });
    await page.theme.setLightTheme();

    await page.request.post(`/remote-compute/jobs/${job.id}/cancel`);
  });
});
