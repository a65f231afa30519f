/**
 * The Compute panel in a sidebar's width: one scroller for all of it, filters that show their
 * choice whole, a failed check's reason in full, "Check" and "Enabled" said in words.
 */
import { expect, test } from '@jupyterlab/galata';

import { api, unique } from './helpers';

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
