/**
 * The machine form as JupyterLab draws its own forms: each kind's options as its engine declares
 * them (the usual ones in view, the rest under "More settings"), a Jupyter server's token asked as
 * a password, Save and check as the lab's accept button, Enabled beside its box.
 */
import { expect, test } from '@jupyterlab/galata';

test.describe('Machine form', () => {
  test.use({ autoGoto: true, viewport: { width: 1400, height: 900 } });

  for (const theme of ['light', 'dark']) {
    test(`shows each kind's own settings, as JupyterLab's forms look, in the ${theme} theme`, async ({ page }) => {
      if (theme === 'dark') {
        await page.theme.setDarkTheme();
      }
      await page.sidebar.openTab('jp-remote-compute-panel');
      await page.locator('#jp-remote-compute-panel').getByRole('button', { name: 'Add a Machine' }).click();
      const form = page.getByRole('form', { name: 'Add a Machine' });
      const kind = form.getByLabel('Kind', { exact: true });
      await kind.selectOption('ssh');
      await expect(form.getByLabel('User (optional)', { exact: true })).toBeVisible();
      await expect(form.getByLabel('Port (optional)', { exact: true })).toBeVisible();
      await expect(form.getByLabel('Token', { exact: true })).toHaveCount(0);
      // The rest of the kind's options, behind "More settings".
      const identity = form.getByLabel('Identity file (optional)', { exact: true });
      await expect(identity).toBeHidden();
      await form.getByText('More settings', { exact: true }).click();
      await expect(identity).toBeVisible();
      // The machine's own webhook, every kind's: its signing key asked by name, not as a token.
      await expect(form.getByLabel('Notify secret (optional)', { exact: true })).toHaveAttribute('type', 'text');
      await expect(form.getByLabel('Notify (optional)', { exact: true })).toBeVisible();

      // A Jupyter server's options: its token, as a password; no SSH port.
      await kind.selectOption('jupyter');
      await expect(form.getByLabel('Token', { exact: true })).toHaveAttribute('type', 'password');
      await expect(form.getByLabel('Port (optional)', { exact: true })).toHaveCount(0);

      // The lab's accept button, and a checkbox beside its label.
      const save = form.getByRole('button', { name: 'Save and check' });
      await expect(save).toHaveClass(/jp-mod-accept/);
      const enabled = form.getByRole('checkbox', { name: 'Enabled' });
      await expect(enabled).toBeChecked();
      const label = enabled.locator('xpath=ancestor::label[1]');
      const [b, l] = [(await enabled.boundingBox())!, (await label.boundingBox())!];
      expect(Math.abs(b.y + b.height / 2 - (l.y + l.height / 2))).toBeLessThan(4);
      // No type picker, each help once.
      await expect(form.locator('select option', { hasText: /^(string|number|null|object)$/ })).toHaveCount(0);
      await form.screenshot({ path: test.info().outputPath(`machine-form-${theme}.png`) });
      await form.getByRole('button', { name: 'Cancel', exact: true }).click();
      if (theme === 'dark') {
        await page.theme.setLightTheme();
      }
    });
  }
});
