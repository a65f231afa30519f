/**
 * Pools in the panel: listed with their machines and rule, offered by the New Job form where
 * machines are, and a job run on one says where it was placed.
 */
import { expect, test } from '@jupyterlab/galata';

import { api, unique } from './helpers';

test.describe('Pools', () => {
  test('are listed, offered by the New Job form, and a job on one says where it went', async ({ page }) => {
    const pool = unique('here').toLowerCase();
    const name = unique('ui-pool-job');
    await page.sidebar.openTab('jp-remote-compute-panel');
    const panel = page.locator('#jp-remote-compute-panel');
    // Made in the pool dialog: a name, the machines ticked, the rule.
    await panel.getByRole('button', { name: 'New Pool' }).click();
    const dialog = page.locator('.jp-Dialog');
    await dialog.getByLabel('Name', { exact: true }).fill(pool);
    await dialog.getByLabel('This machine (local)').check();
    await dialog.getByRole('button', { name: 'Save' }).click();
    const row = panel.getByRole('listitem', { name: `Pool ${pool}` });
    await expect(row).toContainText('local · the first with room');

    await panel.getByRole('button', { name: 'New Job' }).click();
    const form = page.getByRole('form', { name: 'New Job' });
    await form.getByLabel('Machine', { exact: true }).selectOption(pool);
    await form.getByLabel('Command', { exact: true }).fill('echo pooled');
    await form.getByLabel('Name (optional)', { exact: true }).fill(name);
    await form.getByRole('button', { name: 'Run', exact: true }).click();

    const detail = page.getByRole('region', { name: `Job ${name}` });
    await expect(detail.getByText('succeeded', { exact: true })).toBeVisible({ timeout: 90000 });
    await expect(detail).toContainText('placed on local: first with room');
    await row.getByRole('button', { name: `Remove pool ${pool}` }).click();
    await page.locator('.jp-Dialog').getByRole('button', { name: 'Remove' }).click();
    await expect(row).toHaveCount(0);
    expect((await api(page, 'GET', 'pools')).pools.map((p: any) => p.name)).not.toContain(pool);
  });
});
