/**
 * The job list with thousands of jobs: the panel loads one page, pages in as it scrolls,
 * and filters and searches on the server (nothing is downloaded only to be hidden).
 */
import { expect, test } from '@jupyterlab/galata';
import * as fs from 'fs';
import * as path from 'path';

const STATE_FILE = path.join(
  process.env.REMOTE_COMPUTE_UI_TMP ?? '',
  'workspace',
  '.punica',
  'jobs.json'
);

const SEEDED = 2500;

/**
 * Old finished jobs, as months of work leave them, added to the state file beside the jobs
 * other tests ran (written whole and renamed, as the server writes it).
 */
function seedJobs(): void {
  const current = fs.existsSync(STATE_FILE)
    ? JSON.parse(fs.readFileSync(STATE_FILE, 'utf-8'))
    : { schema: 1, jobs: {} };
  for (let i = 0; i < SEEDED; i++) {
    const id = `20250101-000000-ui${String(i).padStart(5, '0')}`;
    const at = new Date(Date.UTC(2025, 0, 1, 0, 0, i)).toISOString();
    const state = i % 5 === 0 ? 'failed' : 'succeeded';
    current.jobs[id] = {
      id,
      key: `seed${i}`,
      machine: 'local',
      kind: 'local',
      spec: { machine: 'local', command: 'python train.py', name: `seed ${i}` },
      state,
      reason: state === 'failed' ? 'exit code 1' : null,
      created: at,
      updated: at,
      started: at,
      ended: at,
      exit_code: state === 'failed' ? 1 : 0
    };
  }
  const tmp = `${STATE_FILE}.ui-seed`;
  fs.writeFileSync(tmp, JSON.stringify(current));
  fs.renameSync(tmp, STATE_FILE);
}

test.describe('Job list', () => {
  test('pages in as it scrolls, filters and searches on the server', async ({
    page
  }) => {
    seedJobs();
    const asked: URL[] = [];
    page.on('request', request => {
      const url = new URL(request.url());
      if (url.pathname.endsWith('/remote-compute/jobs')) {
        asked.push(url);
      }
    });
    await page.sidebar.openTab('jp-remote-compute-panel');
    const panel = page.locator('#jp-remote-compute-panel');
    await panel.getByRole('button', { name: 'Refresh machines and jobs' }).click();
    const list = panel.getByRole('list', { name: 'Jobs' });

    // One page first, and the header says there is more.
    await expect(list).toHaveAttribute('aria-rowcount', /^1\d\d$/);
    await expect(panel.locator('.jp-RemoteCompute-count')).toContainText('+');
    const firstCount = Number(await list.getAttribute('aria-rowcount'));
    expect(firstCount).toBeLessThan(SEEDED);

    // Scrolling to the end pages in the next one.
    await panel
      .locator('.jp-RemoteCompute-jobScroller')
      .evaluate(el => el.scrollTo(0, el.scrollHeight));
    await expect
      .poll(async () => Number(await list.getAttribute('aria-rowcount')))
      .toBeGreaterThan(firstCount);
    expect(asked.some(url => url.searchParams.has('cursor'))).toBe(true);

    // A state filter is asked of the server, and every row shown matches it.
    await panel.getByLabel('Filter jobs by state').selectOption('failed');
    await expect
      .poll(() => asked.some(url => url.searchParams.get('state') === 'failed'))
      .toBe(true);
    await expect(list.locator('li[data-state="succeeded"]')).toHaveCount(0);
    await expect(list.locator('li[data-state="failed"]').first()).toBeVisible();

    // So is a name search.
    await panel.getByLabel('Filter jobs by state').selectOption('');
    await panel.getByLabel('Search jobs by name').fill('seed 2345');
    await expect(list).toHaveAttribute('aria-rowcount', '1');
    await expect(list.getByRole('listitem', { name: 'seed 2345' })).toBeVisible();
    expect(asked.some(url => url.searchParams.get('name') === 'seed 2345')).toBe(
      true
    );
    // No answer ever carried more than a page.
    expect(asked.every(url => url.searchParams.get('limit') === '100')).toBe(
      true
    );
  });
});
