/**
 * Secrets in the panel: add, replace and delete through the Secrets section (delete refused while
 * a job uses the secret, naming it), the value in no DOM node once saved and in no file of the
 * workspace's .punica; and the New Job form's environment rows and resources, whose errors are
 * the server's own words beside the field they name.
 */
import { expect, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import { Locator } from '@playwright/test';
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as path from 'path';

import { api, unique } from './helpers';

const WORKSPACE = path.join(process.env.REMOTE_COMPUTE_UI_TMP ?? '', 'workspace');

/** Every file under a folder, recursively. */
function filesUnder(dir: string): string[] {
  if (!fs.existsSync(dir)) {
    return [];
  }
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap(entry => {
    const full = path.join(dir, entry.name);
    return entry.isDirectory() ? filesUnder(full) : entry.isFile() ? [full] : [];
  });
}

/** The command may not hold the value (the server refuses it, rightly): it compares digests. */
function sameAs(variable: string, value: string): string {
  const digest = crypto.createHash('sha256').update(value).digest('hex');
  return `test "$(printf %s "$${variable}" | sha256sum | cut -c1-64)" = ${digest}`;
}

function filesHolding(dir: string, value: string): string[] {
  return filesUnder(dir).filter(file => fs.readFileSync(file).includes(value));
}

async function openSecrets(page: IJupyterLabPageFixture): Promise<Locator> {
  await page.sidebar.openTab('jp-remote-compute-panel');
  const section = page.locator('#jp-remote-compute-panel').getByRole('region', { name: 'Secrets' });
  // The tests' keyring (plaintext) does not encrypt: the one short warning says so, and only that.
  await expect(section.getByRole('note').filter({ hasText: /^Not encrypted: the keyring backend / })).toBeVisible();
  await expect(section.getByText(/New secrets go to|SAFE_BACKENDS|known to encrypt/)).toHaveCount(0);
  return section;
}

async function waitJob(page: IJupyterLabPageFixture, id: string, state: string): Promise<any> {
  let job: any = null;
  await expect
    .poll(
      async () => {
        job = await api(page, 'GET', `jobs/${id}`);
        return job.state;
      },
      { timeout: 60000 }
    )
    .toBe(state);
  return job;
}

test.use({ autoGoto: true });

test.describe('Secrets in the panel', () => {
  test('adds, replaces and deletes a secret; its value stays out of the page and the workspace', async ({ page }) => {
    const name = `${unique('team')}/token`;
    const first = `first-${unique('v')}-9f3k2m8q7x`;
    const second = `second-${unique('v')}-4h6j1n5w0z`;
    const section = await openSecrets(page);

    // Add
    await section.getByRole('button', { name: 'Add a secret' }).click();
    const add = section.getByRole('form', { name: 'Add a secret' });
    await add.getByLabel('Secret name').fill(name);
    await add.getByLabel('Secret value').fill(first);
    await add.getByRole('button', { name: 'Save' }).click();
    await expect(section.getByRole('status')).toContainText(`Saved ${name}`);
    const row = section.locator(`li[data-name="${name}"]`);
    await expect(row).toBeVisible();
    // Where it lives, in one word; the whole place in the badge's tooltip.
    const badge = row.locator('.jp-RemoteCompute-secretBadge');
    await expect(badge).toHaveText('keyring');
    await expect(badge).toHaveAttribute('title', /keyring/);
    expect(await page.content()).not.toContain(first);

    // Replace; the job proves the new value is the one stored.
    await row.getByRole('button', { name: `Replace ${name}` }).click();
    const replace = row.getByRole('form', { name: `Replace secret ${name}` });
    await replace.getByLabel('Secret value').fill(second);
    await replace.getByRole('button', { name: 'Save' }).click();
    await expect(section.getByRole('status')).toContainText(`Saved ${name}`);
    await expect(replace).toHaveCount(0);
    const html = await page.content();
    expect(html).not.toContain(first);
    expect(html).not.toContain(second);

    // Delete is refused while a job that uses it has not ended, naming the job.
    const gate = path.join(WORKSPACE, unique('gate'));
    const { job } = await api(page, 'POST', 'jobs', {
      machine: 'local',
      command: `${sameAs('T', second)} || exit 5; while [ ! -e '${gate}' ]; do sleep 0.2; done`,
      env: { T: `secret:${name}` },
      name: unique('uses-secret')
    });
    await waitJob(page, job.id, 'running');
    await row.getByRole('button', { name: `Delete ${name}` }).click();
    await page.getByRole('dialog').getByRole('button', { name: 'Delete' }).click();
    const refused = section.getByRole('alert');
    await expect(refused).toContainText('is in use by');
    await expect(refused).toContainText(job.id);
    await expect(row).toBeVisible();

    fs.writeFileSync(gate, '');
    await waitJob(page, job.id, 'succeeded'); // it read the replaced value

    await row.getByRole('button', { name: `Delete ${name}` }).click();
    await page.getByRole('dialog').getByRole('button', { name: 'Delete' }).click();
    await expect(section.getByRole('status')).toContainText(`Deleted ${name}`);
    await expect(row).toHaveCount(0);

    expect(await page.content()).not.toContain(second);
    expect(filesHolding(path.join(WORKSPACE, '.punica'), first)).toEqual([]);
    expect(filesHolding(path.join(WORKSPACE, '.punica'), second)).toEqual([]);
  });

  test('the New Job form takes resources and environment rows, a stored secret picked by name', async ({ page }) => {
    const name = `${unique('form')}/key`;
    const value = `v-${unique('s')}-8c1d7e2f`;
    await api(page, 'PUT', `secrets/${encodeURIComponent(name)}`, { value });
    const panel = page.locator('#jp-remote-compute-panel');
    await page.sidebar.openTab('jp-remote-compute-panel');
    await panel.getByRole('button', { name: 'New Job' }).click();
    const form = page.getByRole('form', { name: 'New Job' });
    await form.getByLabel('Command', { exact: true }).fill(`${sameAs('API_KEY', value)} && echo "mode=$MODE"`);
    const jobName = unique('env-rows');
    await form.getByLabel('Name (optional)', { exact: true }).fill(jobName);

    // A resource the server refuses: its message, beside the field.
    await form.getByLabel('Memory', { exact: true }).fill('lots');
    await form.getByRole('button', { name: 'Run' }).click();
    await expect(form.getByText(/resources\.memory: 'lots' is not an amount of memory/)).toBeVisible();
    await form.getByLabel('Memory', { exact: true }).fill('');

    // A typed value that looks like a secret: refused beside its row, in the server's words.
    await form.getByRole('button', { name: 'Add a variable' }).click();
    await form.getByLabel('Variable name').first().fill('API_KEY');
    await form.getByLabel('Value of API_KEY').fill('ghp_' + 'a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8');
    await form.getByRole('button', { name: 'Run' }).click();
    await expect(form.getByRole('alert')).toContainText('env.API_KEY: looks like');
    await expect(form.getByRole('alert')).toContainText('reference it as secret:NAME');

    // The stored secret, picked by name; a plain value beside it.
    await form.getByLabel('Stored secret for API_KEY').selectOption(name);
    await expect(form.getByLabel('Value of API_KEY')).toHaveValue(`secret:${name}`);
    await form.getByRole('button', { name: 'Add a variable' }).click();
    await form.getByLabel('Variable name').nth(1).fill('MODE');
    await form.getByLabel('Value of MODE').fill('fast');
    await form.getByLabel('CPUs', { exact: true }).fill('1');
    await form.getByRole('button', { name: 'Run' }).click();
    // Run opens the job's detail over the form, so the job is looked up through the API.
    let jobs: any[] = [];
    await expect
      .poll(async () => (jobs = (await api(page, 'GET', `jobs?name=${jobName}`)).jobs).length, { timeout: 30000 })
      .toBe(1);
    const job = await waitJob(page, jobs[0].id, 'succeeded');
    expect(job.spec.env).toEqual({ API_KEY: `secret:${name}`, MODE: 'fast' });
    expect(job.spec.resources).toEqual({ cpus: 1 });
    expect(await page.content()).not.toContain(value);
  });
  test("the New Job form pulls its image with a stored secret's name, never its value", async ({ page }) => {
    // A name as people write them: a random-looking one would be refused as a pasted password.
    const name = 'team-registry/pull';
    const value = `robot:${unique('t')}-5e0a9c1b`;
    await api(page, 'PUT', `secrets/${encodeURIComponent(name)}`, { value });
    await page.sidebar.openTab('jp-remote-compute-panel');
    await page.locator('#jp-remote-compute-panel').getByRole('button', { name: 'New Job' }).click();
    const form = page.getByRole('form', { name: 'New Job' });
    await form.getByLabel('Command', { exact: true }).fill('true');
    const credentials = form.getByLabel('Registry credentials', { exact: true });
    // Without an image (the local machine has no default one) the server refuses them beside the field.
    await credentials.selectOption(name);
    await form.getByRole('button', { name: 'Run', exact: true }).click();
    await expect(credentials).toHaveAttribute('aria-invalid', 'true');
    await expect(form.getByRole('alert')).toContainText('the job runs in no image, so it pulls nothing');
    await form.getByLabel('Image', { exact: true }).fill('127.0.0.1:9/team/trainer:1');
    const sent = page.waitForResponse(r => r.request().method() === 'POST' && /\/remote-compute\/jobs(\?|$)/.test(r.url()));
    await form.getByRole('button', { name: 'Run', exact: true }).click();
    const response = await sent;
    expect(response.ok(), await response.text()).toBeTruthy();
    const body = response.request().postDataJSON();
    expect(body.registry_secret).toBe(name);
    expect(body.environment).toEqual({ image: '127.0.0.1:9/team/trainer:1' });
    expect(JSON.stringify(body)).not.toContain(value);
    expect(await page.content()).not.toContain(value);
  });
});
