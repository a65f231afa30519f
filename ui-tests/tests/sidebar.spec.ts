/**
 * The Compute panel in a sidebar's width: one scroller for all of it, filters that show their
 * choice whole, a failed check's reason in full, "Check" and "Enabled" said in words.
 */
import { expect, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import { Locator } from '@playwright/test';
import { execFileSync } from 'child_process';
import * as path from 'path';

import { api, unique } from './helpers';

const STATE_FILE = path.join(process.env.REMOTE_COMPUTE_UI_TMP ?? '', 'workspace', '.punica', 'jobs.json');

/** A reason far wider than the sidebar's row. */
const LONG =
  'the data loader could not open /data/imagenet/train/shard-00042.tar: permission denied, and the mirror ' +
  'at /mnt/backup/imagenet/train refused the connection as well';

/**
 * Where a job row's time sits against its line and its row, and whether the reason is cut: the time
 * must show whole (nothing of it clipped, inside the row), the reason ends in "…" after a readable start.
 */
async function rowLayout(row: Locator): Promise<Record<string, unknown>> {
  const line = row.locator('.jp-RemoteCompute-jobFacts');
  const time = line.locator('time');
  const reason = line.locator('.jp-RemoteCompute-jobReason');
  await expect(time).toBeVisible();
  await expect(reason).toBeVisible();
  const [rowBox, lineBox, timeBox, reasonBox] = await Promise.all(
    [row, line, time, reason].map(async l => (await l.boundingBox())!)
  );
  const clipped = await time.evaluate(el => {
    // Every box between the time and the row that hides what overflows it must hold the time whole.
    const at = el.getBoundingClientRect();
    for (let box = el.parentElement; box && !box.matches('li'); box = box.parentElement) {
      const r = box.getBoundingClientRect();
      if (getComputedStyle(box).overflow !== 'visible' && (at.left < r.left - 0.5 || at.right > r.right + 0.5)) {
        return true;
      }
    }
    return el.scrollWidth > el.clientWidth + 1;
  });
  const cut = await reason.evaluate(el => ({
    ellipsis: getComputedStyle(el).textOverflow === 'ellipsis',
    overflows: el.scrollWidth > el.clientWidth
  }));
  return {
    text: await time.innerText(),
    timeClipped: clipped,
    timeInRow: timeBox.x >= rowBox.x && timeBox.x + timeBox.width <= rowBox.x + rowBox.width + 0.5,
    timeInLine: timeBox.x + timeBox.width <= lineBox.x + lineBox.width + 0.5,
    reasonAfterTime: reasonBox.x >= timeBox.x + timeBox.width - 0.5,
    reasonInLine: reasonBox.x + reasonBox.width <= lineBox.x + lineBox.width + 0.5,
    // Enough of it to read its start, however long the machine's name.
    reasonReadable: reasonBox.width >= 60,
    reasonCut: cut
  };
}

async function reasonColor(locator: Locator): Promise<string> {
  return locator.evaluate(el => getComputedStyle(el).color);
}

async function bothThemes(page: IJupyterLabPageFixture, check: (theme: string) => Promise<void>): Promise<void> {
  await check('light');
  await page.theme.setDarkTheme();
  await expect(page.locator('body')).toHaveAttribute('data-jp-theme-light', 'false');
  await check('dark');
  await page.theme.setLightTheme();
}

test.describe('Compute panel in the sidebar', () => {
  test.use({ autoGoto: true, viewport: { width: 1400, height: 900 } });

  test('reads whole in its width, scrolls as one, and says Check and Enabled', async ({ page }) => {
    const name = unique('nohost');
    // Nothing listens on the discard port of loopback: the check fails fast, with a long reason.
    const { version } = await api(page, 'GET', 'machines');
    await api(page, 'POST', 'machines', { name, kind: 'ssh', address: '127.0.0.1', options: { port: 9 }, version });
    await page.sidebar.openTab('jp-remote-compute-panel');
    const panel = page.locator('#jp-remote-compute-panel');
    await panel.getByRole('button', { name: 'Refresh machines and jobs' }).click();
    const row = panel.getByRole('listitem', { name });
    await expect(row).toBeVisible();

    // The machine's switch is labelled where it is, and its check is a word, not a tick.
    await expect(row.getByRole('switch', { name: `Enabled: ${name}` })).toBeChecked();
    await expect(row.locator('label', { has: page.getByRole('switch') })).toHaveText('Enabled');
    const check = row.getByRole('button', { name: `Check ${name}` });
    await expect(check).toHaveText('Check');
    await check.click();
    const outcome = row.getByText(/^Check failed/);
    await expect(outcome).toBeVisible({ timeout: 60000 });
    // In full: it wraps rather than ending in "…".
    const clipped = await outcome.evaluate(el => {
      const box = el.closest('.jp-RemoteCompute-check') as HTMLElement;
      return box.scrollWidth > box.clientWidth + 1 || getComputedStyle(box).textOverflow === 'ellipsis';
    });
    expect(clipped).toBe(false);

    // Each filter shows its choice whole ("All machines", "All states").
    for (const label of ['Filter jobs by machine', 'Filter jobs by state']) {
      const fits = await panel.getByLabel(label).evaluate(el => {
        const select = el as HTMLSelectElement;
        const style = getComputedStyle(select);
        const ctx = document.createElement('canvas').getContext('2d')!;
        ctx.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
        const text = ctx.measureText(select.options[select.selectedIndex].text).width;
        return text + parseFloat(style.paddingLeft) + parseFloat(style.paddingRight) <= select.clientWidth;
      });
      expect(fits, label).toBe(true);
    }

    // One scroller for the panel, the Secrets form open too: no section clips its rows in a scroll of its own.
    await panel.getByRole('button', { name: /^Add a secret/ }).click();
    const scrollers = await panel.evaluate(root =>
      [...root.querySelectorAll<HTMLElement>('*')]
        .filter(el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowY))
        .filter(el => !el.closest('textarea, select, input, pre, .jp-RemoteCompute-secretList'))
        .map(el => el.className)
    );
    expect(scrollers).toEqual([expect.stringContaining('jp-RemoteCompute-panelScroller')]);
    await panel.screenshot({ path: test.info().outputPath('panel-light.png') });
    await page.theme.setDarkTheme();
    await panel.screenshot({ path: test.info().outputPath('panel-dark.png') });
    await page.theme.setLightTheme();
  });

  test('cuts a long machine name with an ellipsis, whole in its title, its buttons in the row', async ({ page }) => {
    // The longest name a machine may have (40 characters), far wider than the sidebar's row.
    const name = `${unique('long')}-${'x'.repeat(40)}`.slice(0, 40);
    const { version } = await api(page, 'GET', 'machines');
    await api(page, 'POST', 'machines', { name, kind: 'ssh', address: 'long-name.invalid', version });
    await page.sidebar.openTab('jp-remote-compute-panel');
    const panel = page.locator('#jp-remote-compute-panel');
    await panel.getByRole('button', { name: 'Refresh machines and jobs' }).click();
    const row = panel.getByRole('listitem', { name });
    await expect(row).toBeVisible();
    const shown = row.locator('.jp-RemoteCompute-itemName');
    await expect(shown).toHaveAttribute('title', name);
    const cut = await shown.evaluate(el => ({
      clipped: el.scrollWidth > el.clientWidth,
      ellipsis: getComputedStyle(el).textOverflow === 'ellipsis'
    }));
    expect(cut).toEqual({ clipped: true, ellipsis: true });
    const rowBox = (await row.boundingBox())!;
    for (const button of [
      row.getByRole('switch', { name: `Enabled: ${name}` }),
      row.getByRole('button', { name: `Check ${name}` }),
      row.getByRole('button', { name: `More actions for ${name}` })
    ]) {
      await expect(button).toBeVisible();
      const box = (await button.boundingBox())!;
      expect(box.x + box.width).toBeLessThanOrEqual(rowBox.x + rowBox.width + 0.5);
    }

    // The New Job form's picker: the name cut by the box, whole in its title.
    await panel.getByRole('button', { name: 'New Job' }).click();
    const form = page.getByRole('form', { name: 'New Job' });
    const picker = form.getByLabel('Machine', { exact: true });
    await picker.selectOption(name);
    await expect(picker).toHaveAttribute('title', `${name} (ssh)`);
    // Inside the form's width: the box does not grow to the name's length.
    const overflow = await picker.evaluate(el => {
      const wide: string[] = [];
      const limit = el.closest('[role=form]')!.getBoundingClientRect().right;
      for (let at: Element | null = el; at && at.getAttribute('role') !== 'form'; at = at.parentElement) {
        if (at.getBoundingClientRect().right > limit + 0.5) {
          wide.push(`${at.tagName}.${at.className}`);
        }
      }
      return wide;
    });
    expect(overflow).toEqual([]);
    await api(page, 'DELETE', `machines/${name}`);
  });

  test("a failed or pending job's long reason is cut, its time shows whole, light and dark", async ({ page }) => {
    // A real job that fails with a long last line on stderr: its reason is "exit code 1: <that line>".
    const failedName = unique('failing');
    await api(page, 'POST', 'jobs', {
      machine: 'local',
      command: `python -c "import sys; sys.exit('${LONG}')"`,
      name: failedName
    });
    // A job waiting in a Slurm queue, as the engine leaves it, on a machine whose login node does not answer.
    const machine = unique('hpc');
    const { version } = await api(page, 'GET', 'machines');
    await api(page, 'POST', 'machines', { name: machine, kind: 'slurm', address: '127.0.0.1', options: { port: 9 }, version });
    const pendingName = unique('waiting');
    const stamp = new Date().toISOString().replace(/\D/g, '');
    const pendingId = `${stamp.slice(0, 8)}-${stamp.slice(8, 14)}-${Math.random().toString(16).slice(2, 8)}`;
    execFileSync(process.env.PYTHON ?? 'python', [
      path.join(__dirname, '..', 'seed_jobs.py'),
      STATE_FILE,
      'pending',
      pendingId,
      machine,
      pendingName,
      `waiting for resources: ${LONG}`
    ]);

    await page.sidebar.openTab('jp-remote-compute-panel');
    const panel = page.locator('#jp-remote-compute-panel');
    await panel.getByRole('button', { name: 'Refresh machines and jobs' }).click();
    const failed = panel.getByRole('listitem', { name: failedName });
    const pending = panel.getByRole('listitem', { name: pendingName });
    await expect(failed).toHaveAttribute('data-state', 'failed', { timeout: 60000 });
    await expect(pending).toHaveAttribute('data-state', 'pending');
    await expect(failed.locator('.jp-RemoteCompute-jobReason')).toContainText('exit code 1: the data loader');

    const whole = {
      text: expect.stringMatching(/ago|just now/),
      timeClipped: false,
      timeInRow: true,
      timeInLine: true,
      reasonAfterTime: true,
      reasonInLine: true,
      reasonReadable: true,
      reasonCut: { ellipsis: true, overflows: true }
    };
    await bothThemes(page, async theme => {
      expect(await rowLayout(failed), `failed row, ${theme}`).toEqual(whole);
      expect(await rowLayout(pending), `pending row, ${theme}`).toEqual(whole);
    });

    // A waiting job's reason reads in the row as in its detail: the same colour, in either theme.
    await pending.click();
    const detail = page.getByRole('region', { name: `Job ${pendingName}` });
    await expect(detail.locator('.jp-RemoteCompute-reason')).toContainText('waiting for resources');
    await bothThemes(page, async theme => {
      const inRow = await reasonColor(pending.locator('.jp-RemoteCompute-jobReason'));
      const inDetail = await reasonColor(detail.locator('.jp-RemoteCompute-reason'));
      expect(inRow, `pending reason's colour, ${theme}`).toBe(inDetail);
      expect(inRow).not.toBe(await reasonColor(failed.locator('.jp-RemoteCompute-jobReason')));
    });
    await api(page, 'POST', `jobs/${pendingId}/cancel`, {});
  });

  test('shows no Organization section without a hub, and its admin routes say there is none', async ({ page }) => {
    await page.sidebar.openTab('jp-remote-compute-panel');
    const panel = page.locator('#jp-remote-compute-panel');
    await expect(panel.getByRole('region', { name: 'Machines' })).toBeVisible();
    await expect(panel.getByRole('region', { name: 'Organization' })).toHaveCount(0);
    // No organization in the machine list's answer, so the admin's commands stay off.
    const { organization } = await api(page, 'GET', 'machines');
    expect(organization).toBeUndefined();
    const enabled = await page.evaluate(() =>
      ['remote-compute:add-org-machine', 'remote-compute:show-org-usage'].map(id =>
        (window as any).jupyterapp.commands.isEnabled(id)
      )
    );
    expect(enabled).toEqual([false, false]);
    const quotas = await page.request.get('/remote-compute/organization/quotas');
    expect(quotas.status()).toBe(404);
    expect((await quotas.json()).code).toBe('no_organization');
  });
});
