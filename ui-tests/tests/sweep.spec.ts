/**
 * A sweep in the Compute panel: its trials fill in live (state, machine, parameter, the metric's
 * latest value), sort by any column, the best one marked, charted against its parameter.
 */
import { expect, test } from '@jupyterlab/galata';
import * as fs from 'fs';
import * as path from 'path';

import { api, unique } from './helpers';

const WORKSPACE = path.join(process.env.REMOTE_COMPUTE_UI_TMP ?? '', 'workspace');

// Logs loss = x at steps 0..2; the trial x=3 then waits for the file named in argv, so the view is
// seen filling in while a trial still runs.
const TRIAL = `import os, sys, time
import mlflow
x = float(sys.argv[1])
with mlflow.start_run():
    for step in range(3):
        mlflow.log_metric("loss", x, step=step)
    while x == 3 and not os.path.exists(sys.argv[2]):
        time.sleep(0.05)
`;

test.describe('A sweep in the panel', () => {
  test('fills in live, sorts by the metric and marks the best trial', async ({ page, tmpPath }) => {
    const name = unique('ui-sweep');
    const go = path.join(WORKSPACE, tmpPath, 'go');
    await page.contents.uploadContent(TRIAL, 'text', `${tmpPath}/trial.py`);
    await page.sidebar.openTab('jp-remote-compute-panel');
    const panel = page.locator('#jp-remote-compute-panel');

    const started = await api(page, 'POST', 'pipelines/sweeps', {
      job: {
        machine: 'local',
        command: `python ${tmpPath}/trial.py {x} ${go}`,
        send: [`${tmpPath}/trial.py`],
        name
      },
      parameters: { x: [2, 3, 1] },
      metric: 'loss'
    });
    const run = panel.locator(`[data-run-id="${started.run.id}"]`);
    await expect(run).toContainText(`sweep ${name}`, { timeout: 60000 });
    await run.getByRole('button', { name: `sweep ${name}` }).click();
    const trials = panel.getByLabel(`Trials of sweep ${name}`);
    const rows = trials.locator('tbody tr');
    await expect(rows).toHaveCount(3);

    // Live: two trials done with their values while x=3 still runs, its value already read.
    const three = trials.locator('[data-trial="trial-2"]');
    await expect(three).toContainText('running', { timeout: 90000 });
    await expect(three.locator('.jp-RemoteCompute-sweepMetric')).toHaveText('3', { timeout: 90000 });
    await expect(trials.locator('[data-trial="trial-3"]')).toContainText('succeeded', { timeout: 90000 });
    expect(fs.existsSync(go)).toBe(false);
    await expect(trials.locator('[data-best="true"]')).toHaveAttribute('data-trial', 'trial-3');
    await expect(trials.locator('[data-trial="trial-3"]')).toContainText('local');

    // Sorted by the metric, ascending then descending; the first column's number is the trial.
    const loss = trials.getByRole('button', { name: 'loss' });
    await loss.click();
    await expect(rows.locator('.jp-RemoteCompute-sweepMetric')).toHaveText(['1', '2', '3']);
    await expect(trials.getByRole('columnheader', { name: 'loss' })).toHaveAttribute('aria-sort', 'ascending');
    await loss.click();
    await expect(rows.locator('.jp-RemoteCompute-sweepMetric')).toHaveText(['3', '2', '1']);
    await expect(trials.getByRole('img', { name: /^loss against x: 3 points, best 1 at x 1$/ })).toBeVisible();

    fs.writeFileSync(go, '');
    await expect(run.locator('.jp-RemoteCompute-runLine')).toContainText('succeeded', { timeout: 90000 });
    await expect(trials.getByRole('button', { name: 'Cancel Sweep' })).toBeDisabled();
    await expect(trials.getByRole('button', { name: 'Compare in MLflow' })).toBeEnabled({ timeout: 60000 });
  });

  test('the New Job form runs a sweep, and names a parameter it cannot read', async ({ page }) => {
    const name = unique('ui-form-sweep');
    await page.sidebar.openTab('jp-remote-compute-panel');
    const panel = page.locator('#jp-remote-compute-panel');
    await panel.getByRole('button', { name: 'New Job' }).click();
    const form = page.getByRole('form', { name: 'New Job' });
    await form.getByLabel('Command', { exact: true }).fill('echo trial {x}');
    await form.getByLabel('Name (optional)', { exact: true }).fill(name);
    await form.getByText('Sweep', { exact: true }).click();
    const parameters = form.getByLabel('Parameters', { exact: true });

    await parameters.fill('x =');
    await form.getByRole('button', { name: 'Run sweep', exact: true }).click();
    await expect(form.getByRole('alert')).toContainText('parameters.x: x has an empty value');
    await expect(parameters).toHaveAttribute('aria-invalid', 'true');

    await parameters.fill('x = 1, 2');
    await form.getByRole('button', { name: 'Run sweep', exact: true }).click();
    await expect(form.getByRole('status')).toContainText(`Started sweep ${name}: 2 trials`);
    const run = panel.locator('.jp-RemoteCompute-run', { hasText: `sweep ${name}` });
    await expect(run.locator('.jp-RemoteCompute-runLine')).toContainText('succeeded', { timeout: 90000 });
    await expect(run).toContainText('2 of 2 trials done');
  });
});
