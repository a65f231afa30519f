/**
 * How long ago things happened, as the panel says it: server timestamps read exactly (UTC, in a
 * browser whose time zone is not), whole minutes passed, never "in …" for a past event, and texts
 * that follow the clock as time passes with nothing else changing. The browser's clock is fixed
 * (Playwright's page.clock) against jobs seeded with known times.
 */
import { expect, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import { test as unit } from '@playwright/test';
import { execFileSync } from 'child_process';
import * as path from 'path';

import { parseServerTime, relativeTime } from '../../src/format';
import { unique } from './helpers';

const STATE_FILE = path.join(
  process.env.REMOTE_COMPUTE_UI_TMP ?? '',
  'workspace',
  '.punica',
  'jobs.json'
);

/** seed_jobs.py's first job was created, started and ended then; each next one a second later. */
const SEEDED_AT = Date.parse('2025-01-01T00:00:00Z');

/** When compute.yaml's hand-written machine old-box was added (jupyter_server_test_config.py). */
const OLD_BOX_ADDED = Date.parse('2026-11-29T10:02:00Z');

const MINUTE = 60 * 1000;

/** A future time in words, as no past event may read. */
const FUTURE = /\bin \d+ (min|h|d|mo|y)\b/;

/**
 * Three finished jobs named "<name> 0" to "<name> 2", at SEEDED_AT and the two seconds after it.
 */
function seedJobs(name: string): void {
  execFileSync(process.env.PYTHON ?? 'python', [
    path.join(__dirname, '..', 'seed_jobs.py'),
    STATE_FILE,
    '3',
    unique('t').replace('-', ''), // a job id's part: letters and digits
    name
  ]);
}

async function openPanel(page: IJupyterLabPageFixture) {
  await page.sidebar.openTab('jp-remote-compute-panel');
  const panel = page.locator('#jp-remote-compute-panel');
  await expect(panel.getByRole('heading', { name: 'Machines' })).toBeVisible();
  return panel;
}

/** What the job row shows after the machine: when it started, and how long it ran. */
function rowTime(panel: ReturnType<IJupyterLabPageFixture['locator']>, job: string) {
  return panel.getByRole('listitem', { name: job, exact: true }).locator('time');
}

test.describe('Relative times', () => {
  // Five and a half hours east of UTC: a server time read as local time would be off by that.
  test.use({ autoGoto: true, timezoneId: 'Asia/Kolkata' });

  test('jobs say the whole minutes since they ran and follow the clock', async ({ page }) => {
    const name = unique('clock');
    seedJobs(name);
    await page.clock.setFixedTime(SEEDED_AT + 2 * MINUTE + 30_000);
    const panel = await openPanel(page);
    await panel.getByRole('button', { name: 'Refresh machines and jobs' }).click();
    await panel.getByLabel('Search jobs by name').fill(name);
    const list = panel.getByRole('list', { name: 'Jobs' });
    await expect(list).toHaveAttribute('aria-rowcount', '3');
    for (const i of [0, 1, 2]) {
      await expect(rowTime(panel, `${name} ${i}`)).toHaveText('2 min ago');
    }
    await expect(rowTime(panel, `${name} 0`)).toHaveAttribute(
      'datetime',
      '2025-01-01T00:00:00.000Z'
    );

    await panel.getByRole('listitem', { name: `${name} 1`, exact: true }).click();
    const detail = page.getByRole('region', { name: `Job ${name} 1` });
    const created = detail.locator('dt:text-is("Created") + dd');
    const ended = detail.locator('dt:text-is("Ended") + dd');
    await expect(created).toHaveText('2 min ago');
    await expect(ended).toHaveText('2 min ago');

    // Fourteen minutes later, with no event and no request: the texts move on by themselves.
    await page.clock.setFixedTime(SEEDED_AT + 16 * MINUTE + 30_000);
    for (const i of [0, 1, 2]) {
      await expect(rowTime(panel, `${name} ${i}`)).toHaveText('16 min ago');
    }
    await expect(created).toHaveText('16 min ago');
    await expect(ended).toHaveText('16 min ago');

    // Whole minutes passed: 1 min 59 s is "1 min ago", 2 min is "2 min ago".
    await page.clock.setFixedTime(SEEDED_AT + 2 * MINUTE + 500);
    await expect(rowTime(panel, `${name} 0`)).toHaveText('2 min ago');
    await expect(rowTime(panel, `${name} 1`)).toHaveText('1 min ago');
    await expect(created).toHaveText('1 min ago');

    // An hour and a day on.
    await page.clock.setFixedTime(SEEDED_AT + 61 * MINUTE);
    await expect(rowTime(panel, `${name} 2`)).toHaveText('1 h ago');
    await page.clock.setFixedTime(SEEDED_AT + (3 * 24 * 60 + 1) * MINUTE);
    await expect(created).toHaveText('3 d ago');

    await expect(panel).not.toContainText(FUTURE);
    await expect(detail).not.toContainText(FUTURE);
  });

  test('a browser clock behind the server says "just now", never "in …"', async ({ page }) => {
    const name = unique('behind');
    seedJobs(name);
    // Six minutes before the jobs ran, as a browser whose clock is late sees them.
    await page.clock.setFixedTime(SEEDED_AT - 6 * MINUTE);
    const panel = await openPanel(page);
    await panel.getByRole('button', { name: 'Refresh machines and jobs' }).click();
    await panel.getByLabel('Search jobs by name').fill(name);
    await expect(panel.getByRole('list', { name: 'Jobs' })).toHaveAttribute('aria-rowcount', '3');
    for (const i of [0, 1, 2]) {
      await expect(rowTime(panel, `${name} ${i}`)).toHaveText('just now');
    }
    await expect(panel).not.toContainText(FUTURE);
  });

  test("machines' added and last-check times follow the clock", async ({ page }) => {
    await page.clock.setFixedTime(OLD_BOX_ADDED + 2 * MINUTE + 10_000);
    const panel = await openPanel(page);
    const oldBox = panel.getByRole('listitem', { name: 'old-box' });
    await expect(oldBox.locator('time')).toHaveText('added 2 min ago');

    const local = panel.getByRole('listitem', { name: 'This machine' });
    await panel.getByRole('button', { name: 'Check This machine' }).click();
    const check = local.locator('.jp-RemoteCompute-check');
    await expect(check).toHaveText(/^Check passed just now$/, { timeout: 60000 });

    await page.clock.setFixedTime(OLD_BOX_ADDED + 16 * MINUTE + 10_000);
    await expect(oldBox.locator('time')).toHaveText('added 16 min ago');
    await expect(check).toHaveText('Check passed 14 min ago');
    await expect(panel).not.toContainText(FUTURE);
  });
});

unit.describe('relativeTime and parseServerTime', () => {
  const trans = {
    __: (text: string, ...args: unknown[]) =>
      args.reduce<string>((s, arg, i) => s.replace(`%${i + 1}`, String(arg)), text),
    // As JupyterLab's: the count is %1, the arguments after it %2 on.
    _n: (one: string, many: string, n: number, ...args: unknown[]) =>
      [n, ...args].reduce<string>(
        (s, arg, i) => s.replace(`%${i + 1}`, String(arg)),
        n === 1 ? one : many
      )
  } as any;
  const at = Date.UTC(2025, 0, 1, 0, 0, 0);

  unit('reads server timestamps exactly, with or without an offset', () => {
    const zone = process.env.TZ;
    process.env.TZ = 'Asia/Kolkata';
    try {
      expect(parseServerTime('2025-01-01T00:00:00.000Z')).toBe(at);
      expect(parseServerTime('2025-01-01T00:00:00Z')).toBe(at);
      // No offset: UTC, as the server writes, not the browser's local time.
      expect(parseServerTime('2025-01-01T00:00:00')).toBe(at);
      expect(parseServerTime('2025-01-01 00:00:00')).toBe(at);
      expect(parseServerTime('2025-01-01T05:30:00+05:30')).toBe(at);
      expect(parseServerTime('2025-01-01T05:30:00+0530')).toBe(at);
      // Python's microseconds: the milliseconds kept, the rest cut.
      expect(parseServerTime('2025-01-01T00:00:00.123456Z')).toBe(at + 123);
      expect(parseServerTime('2025-01-01T00:00:00.5Z')).toBe(at + 500);
      // Epoch seconds (an agent's last call, the usage's times).
      expect(parseServerTime(at / 1000)).toBe(at);
      expect(parseServerTime('yesterday')).toBeNaN();
      expect(parseServerTime(null)).toBeNaN();
    } finally {
      if (zone === undefined) {
        delete process.env.TZ;
      } else {
        process.env.TZ = zone;
      }
    }
  });

  unit('says the whole units passed, and never a future', () => {
    const ago = (ms: number) => relativeTime('2025-01-01T00:00:00Z', trans, at + ms);
    expect(ago(0)).toBe('just now');
    expect(ago(44_999)).toBe('just now');
    expect(ago(45_000)).toBe('1 min ago');
    expect(ago(119_999)).toBe('1 min ago');
    expect(ago(120_000)).toBe('2 min ago');
    expect(ago(16 * MINUTE + 59_000)).toBe('16 min ago');
    expect(ago(60 * MINUTE)).toBe('1 h ago');
    expect(ago(25 * 60 * MINUTE)).toBe('1 d ago');
    expect(ago(45 * 24 * 60 * MINUTE)).toBe('1 mo ago');
    expect(ago(400 * 24 * 60 * MINUTE)).toBe('1 y ago');
    // The browser's clock behind the server's: a past event still, never "in 6 min".
    expect(ago(-6 * MINUTE)).toBe('just now');
    expect(relativeTime(null, trans, at)).toBe('');
  });
});
