/**
 * A job's detail says what the job is: the environment its spec asks for, the files it sent in
 * one text, and, from the moment its badge says succeeded, its outputs and MLflow run (or that
 * the run is being recorded), never "none" for what the job has; a log of several nodes shows one
 * node's lines or one rank's.
 */
import { expect, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import * as fs from 'fs';
import * as http from 'http';
import { AddressInfo } from 'net';
import * as path from 'path';

import { api, unique } from './helpers';

const WORKSPACE = path.join(process.env.REMOTE_COMPUTE_UI_TMP ?? '', 'workspace');

// Writes out.txt beside itself once the file named in argv exists, then ends.
const TRAIN = `import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out.txt"), "w") as f:
    f.write("done\\n")
print("trained", flush=True)
`;

async function openDetail(page: IJupyterLabPageFixture, name: string) {
  await page.sidebar.openTab('jp-remote-compute-panel');
  const panel = page.locator('#jp-remote-compute-panel');
  await panel.getByRole('listitem', { name, exact: true }).click();
  const detail = page.getByRole('region', { name: `Job ${name}` });
  await expect(detail).toBeVisible();
  return detail;
}

/** The value beside a label of the detail's facts. */
function fact(detail: ReturnType<IJupyterLabPageFixture['locator']>, label: string) {
  return detail.locator(`dt:text-is("${label}") + dd`);
}

/** A webhook receiver on 127.0.0.1 (a port from the OS) that answers every POST with `status`. */
async function receiver(status: number): Promise<{ url: string; close: () => Promise<void> }> {
  const server = http.createServer((request, response) => {
    request.resume();
    request.on('end', () => {
      response.writeHead(status, { 'Content-Length': '0' });
      response.end();
    });
  });
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/hook`,
    close: () =>
      new Promise<void>(resolve => {
        server.closeAllConnections();
        server.close(() => resolve());
      })
  };
}

test.use({ autoGoto: true });

test.describe('Job detail', () => {
  test('shows the environment the job asked for and what it sent, one text each', async ({ page, tmpPath }) => {
    await page.contents.uploadContent('print("hi")\n', 'text', `${tmpPath}/train.py`);
    await page.contents.uploadContent('scipy\n', 'text', `${tmpPath}/requirements.txt`);
    const name = unique('ui-env');
    const { job } = await api(page, 'POST', 'jobs', {
      machine: 'local',
      command: `python ${tmpPath}/train.py`,
      send: [`${tmpPath}/train.py`],
      environment: { requirements: `${tmpPath}/requirements.txt`, packages: ['numpy'] },
      name
    });
    const plain = unique('ui-plain');
    await api(page, 'POST', 'jobs', { machine: 'local', command: 'true', name: plain });

    try {
      const detail = await openDetail(page, name);
      const environment = fact(detail, 'Environment');
      await expect(environment.getByRole('listitem')).toHaveText([
        `Requirements file: ${tmpPath}/requirements.txt`,
        'Packages: numpy'
      ]);
      await expect(environment).not.toContainText('none');
      // The file it names, then how many files went with the environment's, apart.
      const sent = fact(detail, 'Files sent');
      await expect(sent.getByRole('listitem')).toHaveText([`${tmpPath}/train.py`]);
      await expect(sent.getByText(/^\d+ files?, \d+(\.\d)? (B|KB)$/)).toBeVisible();
      await expect(sent).not.toContainText('none');

      const other = await openDetail(page, plain);
      await expect(fact(other, 'Environment')).toHaveText("the machine's default");
      await expect(fact(other, 'Files sent')).toHaveText('none');
      await expect(fact(other, 'Variables')).toHaveText('none');
    } finally {
      await page.request.post(`/remote-compute/jobs/${job.id}/cancel`);
    }
  });

  test('from the moment it succeeds, its outputs and MLflow run, never "none"', async ({ page, tmpPath }) => {
    test.setTimeout(300000);
    const name = unique('ui-ends');
    const go = path.join(WORKSPACE, tmpPath, 'go');
    await page.contents.uploadContent(TRAIN, 'text', `${tmpPath}/train.py`);
    const { job } = await api(page, 'POST', 'jobs', {
      machine: 'local',
      command: `python ${tmpPath}/train.py ${go}`,
      send: [`${tmpPath}/train.py`],
      bring_back: [`${tmpPath}/out.txt`],
      name
    });
    const detail = await openDetail(page, name);
    await expect(detail.getByText('running', { exact: true })).toBeVisible({ timeout: 120000 });
    await expect(fact(detail, 'Outputs')).toHaveText('when the job ends');

    // Every state the detail shows from here on, with what it says of the outputs and the run.
    await detail.evaluate(el => {
      const seen: string[][] = [];
      (window as any).__detailSeen = seen;
      const read = (label: string): string => {
        const dt = [...el.querySelectorAll('dt')].find(d => d.textContent === label);
        return dt?.nextElementSibling?.textContent ?? '';
      };
      const note = (): void => {
        const state = el.querySelector('.jp-RemoteCompute-jobHeader .jp-RemoteCompute-state')?.textContent ?? '';
        seen.push([state, read('Outputs'), read('MLflow run')]);
      };
      note();
      new MutationObserver(note).observe(el, { subtree: true, childList: true, characterData: true });
    });
    fs.writeFileSync(go, '');

    await expect(detail.getByText('succeeded', { exact: true })).toBeVisible({ timeout: 120000 });
    // The server ends a job with its run recorded: the answer that says succeeded names it.
    const run = (await api(page, 'GET', `jobs/${job.id}`)).mlflow_run_id;
    expect(run).toBeTruthy();
    await expect(detail.getByRole('link', { name: `${tmpPath}/out.txt` })).toBeVisible();
    await expect(detail.getByRole('link', { name: run })).toBeVisible();
    await expect(detail.getByRole('button', { name: 'Open in MLflow' })).toBeVisible();

    const seen: string[][] = await page.evaluate(() => (window as any).__detailSeen);
    const ended = seen.filter(([state]) => state === 'succeeded');
    expect(ended.length).toBeGreaterThan(0);
    for (const [, outputs, mlflow] of ended) {
      expect(outputs).not.toBe('none');
      expect(mlflow).not.toBe('none');
    }
  });

  test('jobs open in one tab: another job replaces the one shown, a shown one is brought back', async ({ page }) => {
    const first = unique('ui-tab-a');
    const second = unique('ui-tab-b');
    await api(page, 'POST', 'jobs', { machine: 'local', command: 'true', name: first });
    // Another command: the same one would be the same work, and attach to the first job.
    await api(page, 'POST', 'jobs', { machine: 'local', command: 'echo second', name: second });
    await openDetail(page, first);
    await openDetail(page, second);
    await openDetail(page, first);
    const jobTabs = page.getByRole('tab', { name: /^Job: / });
    await expect(jobTabs).toHaveCount(1);
    await expect(jobTabs).toHaveText(new RegExp(first));
  });

  test('lists how the last notice to each of its webhooks went', async ({ page }) => {
    const taken = await receiver(200);
    const broken = await receiver(500);
    const name = unique('ui-hooks');
    try {
      await api(page, 'POST', 'jobs', { machine: 'local', command: 'true', name, notify: [taken.url, broken.url] });
      const detail = await openDetail(page, name);
      // The 500's notices are each tried 3 times, 1 s and 2 s apart: its last outcome comes ~15 s after the end.
      await expect(fact(detail, 'Webhooks').getByRole('listitem')).toHaveText(
        [`${taken.url}: told succeeded, HTTP 200`, `${broken.url}: telling succeeded failed: HTTP 500`],
        { timeout: 60_000 }
      );
    } finally {
      await taken.close();
      await broken.close();
    }
  });

  test('a retried job says so in a notification, and lists its attempts with how each ended', async ({ page, tmpPath }) => {
    const name = unique('ui-retry');
    const folder = path.join(WORKSPACE, tmpPath);
    const go = path.join(folder, `${name}.go`);
    const failed = path.join(folder, `${name}.failed-once`);
    // The first attempt fails once the test says go; the next one, after a 2 s backoff, succeeds.
    const command = `test -e ${failed} && exit 0; while [ ! -e ${go} ]; do sleep 0.05; done; touch ${failed}; exit 3`;
    await api(page, 'POST', 'jobs', {
      machine: 'local',
      command,
      retry: { max: 1, on: ['failed'], backoff: '2s' },
      name
    });
    const detail = await openDetail(page, name);
    await expect(detail.locator('.jp-RemoteCompute-state[data-state="running"]').first()).toBeVisible({
      timeout: 30000
    });
    fs.writeFileSync(go, '');
    const toast = page.locator('.Toastify__toast', { hasText: `Job ${name} runs again: attempt 2 of at most 2` });
    await expect(toast).toBeVisible({ timeout: 30000 });
    await expect(toast).toContainText('attempt 1 failed (exit code 3');
    const attempts = fact(detail, 'Attempts').getByRole('listitem');
    await expect(attempts).toHaveText([/^local: failed · \d+s of work lost exit code 3/, 'local: succeeded'], {
      timeout: 60000
    });
  });

  test("a log of several nodes and ranks shows one node's lines or one rank's", async ({ page }) => {
    const name = unique('ui-ranks');
    // The lines as a job of several processes writes them (farside/rank.sh's prefixes).
    const lines = ['[n1 rank 0] zero', '[n1 rank 1] one', '[n2] launcher', '[n2 rank 2] two', `no prefix ${name}`];
    await api(page, 'POST', 'jobs', {
      machine: 'local',
      command: `printf '%s\\n' ${lines.map(line => `'${line}'`).join(' ')}`,
      name
    });
    await openDetail(page, name);
    const log = page.getByRole('log', { name: /Log of job/ });
    await expect(log).toContainText(`no prefix ${name}`, { timeout: 60000 });
    const show = page.getByRole('combobox', { name: 'Show the lines of' });
    await expect(show.locator('option')).toHaveText([
      'All nodes and ranks',
      'Node n1',
      'n1 rank 0',
      'n1 rank 1',
      'Node n2',
      'n2 rank 2'
    ]);
    await show.selectOption({ label: 'Node n2' });
    await expect(log).toHaveText('[n2] launcher\n[n2 rank 2] two');
    await expect(page.getByText('2 lines of node n2')).toBeVisible();
    await show.selectOption({ label: 'n1 rank 1' });
    await expect(log).toHaveText('[n1 rank 1] one');
    await show.selectOption({ label: 'All nodes and ranks' });
    await expect(log).toHaveText(lines.join('\n'));
  });
});
