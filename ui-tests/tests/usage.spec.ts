/**
 * The Usage view: job-hours and GPU-hours per machine per month, drawn from the server's sums of
 * the workspace's usage record, in the light and the dark theme without a console error.
 */
import { expect, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import * as fs from 'fs';
import * as path from 'path';

const USAGE_RECORD = path.join(
  process.env.REMOTE_COMPUTE_UI_TMP ?? '',
  'workspace',
  '.punica',
  'usage.jsonl'
);

function attempt(
  job: string,
  machine: string,
  start: string,
  hours: number,
  gpus: number
): string {
  const started = Date.parse(start) / 1000;
  return JSON.stringify({
    job,
    attempt: 1,
    name: job,
    machine,
    kind: 'ssh',
    user: 'ada',
    queued: started - 600,
    started,
    ended: started + hours * 3600,
    state: 'succeeded',
    gpus,
    source: 'engine',
    bytes_sent: 1000,
    bytes_fetched: 2000,
    price_per_hour: machine === 'gpu-box' ? 2.5 : null,
    running: false
  });
}

// Three machine-months: 2 h and 1 h on 4 GPUs in October, 3 h on a CPU box in November.
const LINES = [
  attempt('usage-ui-a', 'gpu-box', '2026-10-01T10:00:00Z', 2, 4),
  attempt('usage-ui-b', 'gpu-box', '2026-10-02T10:00:00Z', 1, 4),
  attempt('usage-ui-c', 'cpu-box', '2026-11-03T10:00:00Z', 3, 0),
  attempt('usage-ui-d', 'local', '2026-11-04T10:00:00Z', 0.25, 0)
];

async function openUsage(page: IJupyterLabPageFixture) {
  // The sidebar tab by its name (the Compute panel), clicked like a person would.
  await page.getByRole('tab', { name: 'Compute' }).click();
  const panel = page.locator('#jp-remote-compute-panel');
  await expect(panel.getByRole('heading', { name: 'Machines' })).toBeVisible();
  await panel.getByRole('button', { name: 'Usage' }).click();
  const chart = page.getByRole('img', {
    name: 'Job-hours and GPU-hours per machine per month'
  });
  await expect(chart).toBeVisible();
  return chart;
}

test.describe('Usage view', () => {
  test.beforeAll(() => {
    fs.mkdirSync(path.dirname(USAGE_RECORD), { recursive: true });
    fs.appendFileSync(USAGE_RECORD, LINES.join('\n') + '\n');
  });

  test('draws job-hours and GPU-hours per machine and month in both themes', async ({ page }) => {
    const problems: string[] = [];
    page.on('console', message => {
      if (message.type() === 'error') {
        problems.push(message.text());
      }
    });
    page.on('pageerror', error => problems.push(error.message));

    const chart = await openUsage(page);
    // The built-in machine by the name the table gives it.
    for (const category of ['gpu-box · 2026-10', 'cpu-box · 2026-11', 'This machine · 2026-11']) {
      await expect(chart.locator(`g[data-category="${category}"] rect`)).toHaveCount(2);
    }
    // Every tick says its own value, and no category label is cut at the chart's edges.
    const ticks = await chart.locator('g:not([data-category]) > text').allTextContents();
    expect(new Set(ticks).size).toBe(ticks.length);
    const box = (await chart.boundingBox())!;
    for (const text of await chart.locator('g[data-category] > text').all()) {
      const b = (await text.boundingBox())!;
      expect(b.x).toBeGreaterThanOrEqual(box.x - 1);
      expect(b.y + b.height).toBeLessThanOrEqual(box.y + box.height + 1);
    }
    // October's GPU box: 3 job-hours, 12 GPU-hours, as the bars' tooltips say.
    const october = chart.locator('g[data-category="gpu-box · 2026-10"] rect title');
    await expect(october.nth(0)).toHaveText('gpu-box · 2026-10 · Job-hours: 3.00 h');
    await expect(october.nth(1)).toHaveText('gpu-box · 2026-10 · GPU-hours (allocated): 12.0 h');
    const table = page.getByRole('table', { name: 'Usage per machine and month' });
    await expect(table.getByRole('row', { name: /gpu-box 2026-10/ })).toContainText('~7.50');

    const label = chart.locator('text').first();
    const lightFill = await label.evaluate(el => getComputedStyle(el).fill);

    await page.theme.setDarkTheme();
    await expect(page.locator('body')).toHaveAttribute('data-jp-theme-light', 'false');
    await expect(chart).toBeVisible();
    // The chart's text follows the theme's variables (a fixed colour would not change).
    await expect.poll(() => label.evaluate(el => getComputedStyle(el).fill)).not.toBe(lightFill);
    await page.theme.setLightTheme();

    expect(problems).toEqual([]);
  });
});
