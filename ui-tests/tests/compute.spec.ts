/**
 * The Compute panel against a real server: machines written to compute.yaml (comments
 * kept, no token), checks reported as notifications, inline errors, and jobs on this
 * machine followed live (state, log) and cancelled.
 */
import { expect, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import { Locator } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';

import { unique } from './helpers';

const COMPUTE_YAML = path.join(
  process.env.REMOTE_COMPUTE_UI_TMP ?? '',
  'workspace',
  '.punica',
  'compute.yaml'
);

function computeYaml(): string {
  return fs.readFileSync(COMPUTE_YAML, 'utf-8');
}

const SLOW_SCRIPT = `import os, sys, time
n = int(sys.argv[1]) if len(sys.argv) > 1 else 6
for i in range(1, n + 1):
    print(f"step {i} of {n}", flush=True)
    time.sleep(0.7)
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out.txt"), "w") as f:
    f.write("done\\n")
print("finished", flush=True)
`;

async function openPanel(page: IJupyterLabPageFixture): Promise<Locator> {
  await page.sidebar.openTab('jp-remote-compute-panel');
  const panel = page.locator('#jp-remote-compute-panel');
  await expect(panel.getByRole('heading', { name: 'Machines' })).toBeVisible();
  return panel;
}

async function openAddForm(page: IJupyterLabPageFixture): Promise<Locator> {
  const panel = await openPanel(page);
  await panel.getByRole('button', { name: 'Add a Machine' }).click();
  const form = page.getByRole('form', { name: 'Add a Machine' });
  await expect(form).toBeVisible();
  // The kinds come with the machine list; the select is filled once they arrived.
  await expect(form.getByLabel('Kind', { exact: true }).locator('option[value="ssh"]')).toHaveCount(1);
  return form;
}

async function startJob(
  page: IJupyterLabPageFixture,
  tmpPath: string,
  name: string,
  steps: number
): Promise<Locator> {
  await page.contents.uploadContent(SLOW_SCRIPT, 'text', `${tmpPath}/slow.py`);
  const panel = await openPanel(page);
  await panel.getByRole('button', { name: 'New Job' }).click();
  const form = page.getByRole('form', { name: 'New Job' });
  await expect(form).toBeVisible();
  await expect(form.getByLabel('Machine', { exact: true })).toHaveValue('local');
  await form.getByLabel('Command', { exact: true }).fill(`python ${tmpPath}/slow.py ${steps}`);
  await form.getByLabel('Files to send', { exact: true }).fill(`${tmpPath}/slow.py`);
  await form.getByLabel('Files to bring back', { exact: true }).fill(`${tmpPath}/out.txt`);
  await form.getByLabel('Name (optional)', { exact: true }).fill(name);
  await form.getByRole('button', { name: 'Run', exact: true }).click();
  const detail = page.getByRole('region', { name: `Job ${name}` });
  await expect(detail).toBeVisible();
  return detail;
}

/**
 * Run `check`; if it fails, fail with the server's record of the job named `name` added, so a
 * failure tells whether the job was elsewhere (still queued or sending) or the page was behind.
 */
async function withJobOnServer(
  page: IJupyterLabPageFixture,
  name: string,
  check: () => Promise<void>
): Promise<void> {
  try {
    await check();
  } catch (error) {
    const answer = await page.request.get('/remote-compute/jobs');
    const jobs: { name?: string }[] = answer.ok() ? ((await answer.json()).jobs ?? []) : [];
    const job = jobs.find(j => j.name === name) ?? `not listed (${answer.status()})`;
    throw new Error(`${error}\nthe server's record of ${name}: ${JSON.stringify(job)}`);
  }
}

/**
 * The WCAG contrast ratio of an element's text against its background, as the browser paints them
 * (any CSS colour, alpha blended over the nearest opaque background).
 */
async function contrastOf(element: Locator): Promise<number> {
  return element.evaluate(el => {
    const ctx = document.createElement('canvas').getContext('2d')!;
    const rgba = (css: string): number[] => {
      ctx.clearRect(0, 0, 1, 1);
      ctx.fillStyle = css;
      ctx.fillRect(0, 0, 1, 1);
      const [r, g, b, a] = ctx.getImageData(0, 0, 1, 1).data;
      return [r, g, b, a / 255];
    };
    const over = (top: number[], below: number[]): number[] =>
      [0, 1, 2].map(i => top[i] * top[3] + below[i] * (1 - top[3])).concat(1);
    const layers: number[][] = [];
    for (let node: Element | null = el; node; node = node.parentElement) {
      const layer = rgba(getComputedStyle(node).backgroundColor);
      layers.push(layer);
      if (layer[3] === 1) {
        break;
      }
    }
    const background = layers.reduceRight((below, top) => over(top, below), [255, 255, 255, 1]);
    const text = over(rgba(getComputedStyle(el).color), background);
    const luminance = (c: number[]): number => {
      const [r, g, b] = c.slice(0, 3).map(v => {
        const s = v / 255;
        return s <= 0.03928 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4;
      });
      return 0.2126 * r + 0.7152 * g + 0.0722 * b;
    };
    const [light, dark] = [luminance(text), luminance(background)].sort((a, b) => b - a);
    return (light + 0.05) / (dark + 0.05);
  });
}

/** The element reads at WCAG AA (4.5:1) in the light theme and in the dark one. */
async function expectReadableInBothThemes(
  page: IJupyterLabPageFixture,
  element: Locator
): Promise<void> {
  expect(await contrastOf(element)).toBeGreaterThanOrEqual(4.5);
  await page.theme.setDarkTheme();
  try {
    expect(await contrastOf(element)).toBeGreaterThanOrEqual(4.5);
  } finally {
    await page.theme.setLightTheme();
  }
}

test.describe('Compute panel', () => {
  test.use({ autoGoto: true });

  test('adds a machine through the form and keeps the comments of compute.yaml', async ({ page }) => {
    const name = unique('gpu');
    const form = await openAddForm(page);
    await form.getByLabel('Name', { exact: true }).fill(name);
    await form.getByLabel('Kind', { exact: true }).selectOption('ssh');
    await form.getByLabel('Address', { exact: true }).fill('gpu-box.lab.invalid');
    await form.getByLabel('Port (optional)', { exact: true }).fill('2222');
    await form.getByRole('button', { name: 'Save', exact: true }).click();
    await expect(form).toBeHidden();

    const panel = await openPanel(page);
    const row = panel.getByRole('listitem', { name });
    await expect(row).toBeVisible();
    await expect(row).toContainText('gpu-box.lab.invalid');
    await expect(row.getByRole('switch', { name: `Enabled: ${name}` })).toBeChecked();

    const text = computeYaml();
    expect(text).toContain(`${name}:`);
    expect(text).toContain('port: 2222');
    expect(text).toContain('# Hand-written note: the GPU box is shared, ask the team before long runs.');
    expect(text).toContain('old-box:  # kept for reference');
  });

  test('duplicates and removes a machine from its menu, after confirmation', async ({ page }) => {
    const name = unique('dup');
    const form = await openAddForm(page);
    await form.getByLabel('Name', { exact: true }).fill(name);
    await form.getByLabel('Address', { exact: true }).fill('dup.invalid');
    await form.getByRole('button', { name: 'Save', exact: true }).click();
    await expect(form).toBeHidden();

    const panel = await openPanel(page);
    await panel.getByRole('button', { name: `More actions for ${name}` }).click();
    await page.getByRole('menuitem', { name: `Duplicate Machine ${name}` }).click();
    const copy = page.getByRole('form', { name: 'Add a Machine' });
    await expect(copy.getByLabel('Name', { exact: true })).toHaveValue(`${name}-copy`);
    await expect(copy.getByLabel('Address', { exact: true })).toHaveValue('dup.invalid');
    await copy.getByRole('button', { name: 'Cancel', exact: true }).click();
    await expect(copy).toBeHidden();

    await panel.getByRole('button', { name: `More actions for ${name}` }).click();
    await page.getByRole('menuitem', { name: `Remove Machine ${name}` }).click();
    const dialog = page.getByRole('dialog');
    await expect(dialog).toContainText(`Remove machine ${name}?`);
    await dialog.getByRole('button', { name: 'Remove', exact: true }).click();
    await expect(panel.getByRole('listitem', { name })).toHaveCount(0);
    expect(computeYaml()).not.toContain(`${name}:`);
    expect(computeYaml()).toContain('# Hand-written note');
  });

  test('Save and check reports the result as a notification', async ({ page }) => {
    const name = unique('nohost');
    const form = await openAddForm(page);
    await form.getByLabel('Name', { exact: true }).fill(name);
    await form.getByLabel('Kind', { exact: true }).selectOption('ssh');
    // Nothing listens on the discard port of loopback: the check fails fast.
    await form.getByLabel('Address', { exact: true }).fill('127.0.0.1');
    await form.getByLabel('Port (optional)', { exact: true }).fill('9');
    await form.getByRole('button', { name: 'Save and check' }).click();
    await expect(form).toBeHidden();

    await expect(page.getByText(new RegExp(`${name} could not be reached`))).toBeVisible({ timeout: 60000 });
    await page.getByRole('button', { name: 'Details' }).first().click();
    const dialog = page.getByRole('dialog');
    await expect(dialog).toContainText(`Check of ${name} failed`);
    await dialog.getByRole('button', { name: 'Close' }).click();

    const panel = await openPanel(page);
    await expect(panel.getByRole('listitem', { name })).toContainText('Check failed');

    // And a machine that answers: this one, with every common fact (GPUs, or "no GPU", and free disk).
    await panel.getByRole('button', { name: 'Check This machine' }).click();
    await expect(page.getByText(/local answered: .*\d+ CPUs · .+ · .*free disk/)).toBeVisible();
  });

  test('shows a server-side validation error inline on its field', async ({ page }) => {
    const form = await openAddForm(page);
    const nameField = form.getByLabel('Name', { exact: true });
    await nameField.fill('Bad Name!');
    await form.getByLabel('Address', { exact: true }).fill('somewhere.invalid');
    await form.getByRole('button', { name: 'Save', exact: true }).click();
    await expect(nameField).toHaveAttribute('aria-invalid', 'true');
    await expect(form.getByRole('alert')).toContainText('lowercase letters');
    expect(computeYaml()).not.toContain('Bad Name');
    // Typing again clears the error.
    await nameField.fill('good-name');
    await expect(nameField).toHaveAttribute('aria-invalid', 'false');
  });

  test("sends the New Job form's Image as the environment's and shows its refusal there", async ({ page }) => {
    const panel = await openPanel(page);
    await panel.getByRole('button', { name: 'New Job' }).click();
    const form = page.getByRole('form', { name: 'New Job' });
    await form.getByLabel('Command', { exact: true }).fill('true');
    const runtime = form.getByLabel('Container runtime', { exact: true });
    await expect(runtime).toBeDisabled(); // a runtime runs an image: none is named yet
    const image = form.getByLabel('Image', { exact: true });
    await image.fill('not a reference;');
    await expect(runtime).toBeEnabled();
    await runtime.selectOption('podman');
    await form.getByRole('button', { name: 'Run', exact: true }).click();
    await expect(image).toHaveAttribute('aria-invalid', 'true');
    await expect(form.getByRole('alert')).toContainText('environment.image');
    await expect(form.getByRole('alert')).toContainText('is not an image reference');
  });

  test("picks the New Job form's requirements file from the workspace", async ({ page, tmpPath }) => {
    await page.contents.uploadContent('numpy\n', 'text', `${tmpPath}/requirements.txt`);
    await page.contents.uploadContent('x = 1\n', 'text', `${tmpPath}/train.py`);
    const panel = await openPanel(page);
    await panel.getByRole('button', { name: 'New Job' }).click();
    const form = page.getByRole('form', { name: 'New Job' });
    await form.getByRole('button', { name: 'Choose Requirements file' }).click();
    const dialog = page.locator('.jp-Dialog');
    const listing = dialog.locator('.jp-DirListing-content');
    // It opens where the file browser is, and offers only what can be a requirements file (no .py).
    await expect(listing.getByText('requirements.txt', { exact: true })).toBeVisible();
    await expect(listing.getByText('train.py', { exact: true })).toHaveCount(0);
    await listing.getByText('requirements.txt', { exact: true }).click();
    await dialog.getByRole('button', { name: 'Select' }).click();
    await expect(dialog).toHaveCount(0);
    await expect(form.getByLabel('Requirements file', { exact: true })).toHaveValue(`${tmpPath}/requirements.txt`);
  });

  test('refuses a stale write and offers to reload', async ({ page }) => {
    const name = unique('stale');
    const form = await openAddForm(page);
    await form.getByLabel('Name', { exact: true }).fill(name);
    await form.getByLabel('Address', { exact: true }).fill('stale.invalid');
    // Someone edits the file by hand meanwhile.
    fs.appendFileSync(COMPUTE_YAML, '# edited by hand while the form was open\n');
    await form.getByRole('button', { name: 'Save', exact: true }).click();
    await expect(form.getByRole('alert')).toContainText('compute.yaml changed on disk');
    expect(computeYaml()).not.toContain(`${name}:`);
    await form.getByRole('button', { name: 'Reload' }).click();
    await expect(form.getByRole('alert')).toBeHidden();
    await form.getByRole('button', { name: 'Save', exact: true }).click();
    await expect(form).toBeHidden();
    expect(computeYaml()).toContain(`${name}:`);
    expect(computeYaml()).toContain('# edited by hand while the form was open');
  });

  test('runs a job on this machine and follows its state and log', async ({ page, tmpPath }) => {
    const name = unique('ui-run');
    const detail = await startJob(page, tmpPath, name, 6);
    const log = page.getByRole('log', { name: /Log of job/ });

    await withJobOnServer(page, name, () =>
      expect(detail.getByText('running', { exact: true })).toBeVisible({ timeout: 60000 })
    );
    await expect(log).toContainText('step 1 of 6');
    await expect(log).toContainText('step 4 of 6');
    await expect(detail.getByText('succeeded', { exact: true })).toBeVisible({ timeout: 90000 });
    await expect(log).toContainText('finished');
    // The output came back and opens in JupyterLab.
    const output = detail.getByRole('link', { name: `${tmpPath}/out.txt` });
    await expect(output).toBeVisible();
    // A notification says the job ended, even though nobody asked.
    await expect(page.getByText(`Job ${name} on local succeeded.`)).toBeVisible();
    await output.click();
    await expect(page.getByRole('main').getByRole('tab', { name: /out\.txt/ })).toBeVisible();

    // The job is in the panel's list, newest first.
    const panel = await openPanel(page);
    const row = panel.getByRole('listitem', { name });
    await expect(row).toContainText('succeeded');

    // "Run again" opens the New Job form filled in.
    await row.click();
    await detail.getByRole('button', { name: 'Run Again' }).click();
    const form = page.getByRole('form', { name: 'New Job' });
    await expect(form.getByLabel('Command', { exact: true })).toHaveValue(`python ${tmpPath}/slow.py 6`);
    await expect(form.getByLabel('Files to bring back', { exact: true })).toHaveValue(`${tmpPath}/out.txt`);
  });

  test("offers 'Run on a Machine…' for a Python file in the file browser", async ({ page, tmpPath }) => {
    await page.contents.uploadContent('print("hello")\n', 'text', `${tmpPath}/hello.py`);
    await page.filebrowser.openDirectory(tmpPath);
    await page.getByRole('listitem', { name: /hello\.py/ }).click({ button: 'right' });
    await page.getByRole('menuitem', { name: 'Run on a Machine…', exact: true }).click();
    const form = page.getByRole('form', { name: 'New Job' });
    await expect(form.getByLabel('Command', { exact: true })).toHaveValue(`python ${tmpPath}/hello.py`);
    await expect(form.getByLabel('Files to send', { exact: true })).toHaveValue(`${tmpPath}/hello.py`);
  });

  test('cancels a running job', async ({ page, tmpPath }) => {
    const name = unique('ui-cancel');
    const detail = await startJob(page, tmpPath, name, 200);
    const log = page.getByRole('log', { name: /Log of job/ });
    await expect(log).toContainText('step 2 of 200', { timeout: 60000 });
    await detail.getByRole('button', { name: 'Cancel', exact: true }).click();
    const dialog = page.getByRole('dialog');
    await expect(dialog).toContainText(`Cancel job ${name}?`);
    await dialog.getByRole('button', { name: 'Cancel Job' }).click();
    await expect(detail.getByText('cancelled', { exact: true })).toBeVisible({ timeout: 60000 });
    await expect(detail).toContainText('cancelled by');
    await expect(detail.getByRole('button', { name: 'Cancel', exact: true })).toBeHidden();
    await expectReadableInBothThemes(page, detail.locator('.jp-RemoteCompute-reason'));
  });

  test("a failed job's reason reads in both themes", async ({ page }) => {
    const name = unique('ui-fail');
    const panel = await openPanel(page);
    await panel.getByRole('button', { name: 'New Job' }).click();
    const form = page.getByRole('form', { name: 'New Job' });
    await form.getByLabel('Command', { exact: true }).fill('echo the dataset is missing >&2; exit 3');
    await form.getByLabel('Name (optional)', { exact: true }).fill(name);
    await form.getByRole('button', { name: 'Run', exact: true }).click();
    const detail = page.getByRole('region', { name: `Job ${name}` });
    await expect(detail.getByText('failed', { exact: true })).toBeVisible({ timeout: 90000 });
    const reason = detail.getByRole('alert');
    await expect(reason).toContainText('the dataset is missing');
    await expectReadableInBothThemes(page, reason);
  });

  test('follows a log of megabytes and keeps only the last lines', async ({ page, tmpPath }) => {
    const name = unique('ui-big-log');
    const script = `for i in range(1, 20001):\n    print(f"line {i:05d} " + "x" * 60)\n`;
    await page.contents.uploadContent(script, 'text', `${tmpPath}/big.py`);
    const panel = await openPanel(page);
    await panel.getByRole('button', { name: 'New Job' }).click();
    const form = page.getByRole('form', { name: 'New Job' });
    await form.getByLabel('Command', { exact: true }).fill(`python ${tmpPath}/big.py`);
    await form.getByLabel('Files to send', { exact: true }).fill(`${tmpPath}/big.py`);
    await form.getByLabel('Name (optional)', { exact: true }).fill(name);
    await form.getByRole('button', { name: 'Run', exact: true }).click();
    const detail = page.getByRole('region', { name: `Job ${name}` });
    await expect(detail.getByText('succeeded', { exact: true })).toBeVisible({ timeout: 90000 });
    const log = page.getByRole('log', { name: /Log of job/ });
    // Following: the end of the log is in view, the start was dropped (5000 lines kept).
    await expect(log).toContainText('line 20000 ');
    await expect(page.getByText('15000 earlier lines not shown (keeping the last 5000)')).toBeVisible();
    await expect(page.getByText('Log complete.')).toBeVisible();
    // Only the lines in view are in the DOM.
    const rendered = await log.evaluate(el => (el.textContent ?? '').split('\n').length);
    expect(rendered).toBeLessThan(200);
  });

  test("keeps a Jupyter machine's token out of compute.yaml", async ({ page }) => {
    const answer = await page.request.get('/remote-compute/machines');
    const kinds: { kind: string }[] = (await answer.json()).kinds ?? [];
    test.skip(!kinds.some(k => k.kind === 'jupyter'), 'the jupyter kind is not installed');

    const name = unique('hub');
    const token = `tok${Date.now()}SecretValue`;
    const form = await openAddForm(page);
    await form.getByLabel('Name', { exact: true }).fill(name);
    await form.getByLabel('Kind', { exact: true }).selectOption('jupyter');
    await form.getByLabel('Address', { exact: true }).fill('http://127.0.0.1:9/');
    const tokenField = form.getByLabel('Token', { exact: true });
    await expect(tokenField).toHaveAttribute('type', 'password');
    await expect(form).toContainText('compute.yaml keeps only its name');
    await tokenField.fill(token);
    await form.getByRole('button', { name: 'Save', exact: true }).click();
    await expect(form).toBeHidden();

    const panel = await openPanel(page);
    await expect(panel.getByRole('listitem', { name })).toBeVisible();
    const text = computeYaml();
    expect(text).toContain(`${name}:`);
    expect(text).toContain('token_secret:');
    expect(text).not.toContain(token);
  });
});
