/**
 * The New Job form as JupyterLab draws its own (point 9 of "What a person sees"): Run is the lab's
 * accept button, a checkbox sits beside its label, "Add a variable" is a button, and "New Job"
 * after a job was started opens an empty form, where "Run Again" opens it filled in.
 */
import { expect, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import { Locator } from '@playwright/test';

import { unique } from './helpers';

async function openForm(page: IJupyterLabPageFixture): Promise<Locator> {
  await page.sidebar.openTab('jp-remote-compute-panel');
  await page.locator('#jp-remote-compute-panel').getByRole('button', { name: 'New Job', exact: true }).click();
  const form = page.getByRole('form', { name: 'New Job', exact: true });
  await expect(form.getByLabel('Command', { exact: true })).toBeVisible();
  return form;
}

/** The painted background of a button, and whether it differs from the page's. */
async function painted(button: Locator): Promise<{ background: string; color: string }> {
  return button.evaluate(el => {
    const style = getComputedStyle(el);
    return { background: style.backgroundColor, color: style.color };
  });
}

test.describe('New Job form', () => {
  test.use({ autoGoto: true, viewport: { width: 1400, height: 900 } });

  for (const theme of ['light', 'dark']) {
    test(`looks like JupyterLab's own form in the ${theme} theme`, async ({ page }) => {
      if (theme === 'dark') {
        await page.theme.setDarkTheme();
      }
      const form = await openForm(page);
      // Run is the accept button the lab's dialogs use: filled with the accept colour, white text.
      const run = form.getByRole('button', { name: 'Run', exact: true });
      await expect(run).toHaveClass(/jp-mod-accept/);
      const accept = await page.evaluate(() => {
        const probe = document.createElement('button');
        probe.className = 'jp-mod-styled jp-mod-accept';
        document.body.appendChild(probe);
        const background = getComputedStyle(probe).backgroundColor;
        probe.remove();
        return background;
      });
      expect((await painted(run)).background).toBe(accept);
      expect((await painted(run)).color).toBe('rgb(255, 255, 255)');

      // A checkbox beside its label, on its line.
      const box = form.getByRole('checkbox', { name: 'The same packages as this server’s Python' });
      const label = box.locator('xpath=ancestor::label[1]');
      const [b, l] = [(await box.boundingBox())!, (await label.boundingBox())!];
      expect(b.x).toBeLessThan(l.x + 4);
      expect(Math.abs(b.y + b.height / 2 - (l.y + l.height / 2))).toBeLessThan(4);
      expect(l.width).toBeGreaterThan(b.width * 4);

      // "Add a variable" is a button that looks like one: painted, not text on the page.
      const add = form.getByRole('button', { name: 'Add a variable' });
      expect((await painted(add)).background).not.toBe('rgba(0, 0, 0, 0)');

      // Help once, no type picker: one description per field, no "string"/"number" choice.
      await expect(form.getByText('Seconds, or e.g.')).toHaveCount(1);
      await expect(form.locator('select option', { hasText: /^(string|number|null|array)$/ })).toHaveCount(0);
      await form.screenshot({ path: test.info().outputPath(`job-form-${theme}.png`) });
      if (theme === 'dark') {
        await page.theme.setLightTheme();
      }
    });
  }

  test('starts empty for a new job after a run, and filled in for "Run Again"', async ({ page }) => {
    const name = unique('fresh');
    let form = await openForm(page);
    await form.getByLabel('Command', { exact: true }).fill('echo fresh');
    await form.getByLabel('Name (optional)', { exact: true }).fill(name);
    await form.getByLabel('CPUs', { exact: true }).fill('1');
    await form.getByRole('button', { name: 'Run', exact: true }).click();
    const detail = page.getByRole('region', { name: `Job ${name}` });
    await expect(detail).toBeVisible();
    await expect(detail.getByText('succeeded', { exact: true }).first()).toBeVisible({ timeout: 60000 });

    // A new job: nothing of the last one.
    form = await openForm(page);
    await expect(form.getByLabel('Command', { exact: true })).toHaveValue('');
    await expect(form.getByLabel('Name (optional)', { exact: true })).toHaveValue('');
    await expect(form.getByLabel('CPUs', { exact: true })).toHaveValue('');
    // Typed and not run: brought back as it was.
    await form.getByLabel('Command', { exact: true }).fill('echo half-typed');
    await page.getByRole('main').getByRole('tab', { name: /^Job: / }).first().click();
    form = await openForm(page);
    await expect(form.getByLabel('Command', { exact: true })).toHaveValue('echo half-typed');

    // "Run Again": the job's own settings.
    await page.getByRole('main').getByRole('tab', { name: /^Job: / }).first().click();
    await page.getByRole('region', { name: `Job ${name}` }).getByRole('button', { name: 'Run Again' }).click();
    form = page.getByRole('form', { name: 'New Job' });
    await expect(form.getByLabel('Command', { exact: true })).toHaveValue('echo fresh');
    await expect(form.getByLabel('Name (optional)', { exact: true })).toHaveValue(name);
    await expect(form.getByLabel('CPUs', { exact: true })).toHaveValue('1');
  });
});
