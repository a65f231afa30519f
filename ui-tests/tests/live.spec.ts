/**
 * Live updates pushed by the server: a job's metrics charted in its detail while it runs, and
 * a job list that follows the event socket, with no timed requests while that socket is up.
 */
import {
  expect,
  galata,
  IJupyterLabPageFixture,
  test
} from '@jupyterlab/galata';
import { WebSocketRoute } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';

import { unique } from './helpers';

const WORKSPACE = path.join(process.env.REMOTE_COMPUTE_UI_TMP ?? '', 'workspace');

// Logs three points, waits until the file named in argv exists, logs a last one, ends.
const TRAIN = `import os, sys, time
import mlflow
with mlflow.start_run():
    for step in range(3):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
    print("logged", flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    mlflow.log_metric("loss", 0.125, step=3)
print("trained", flush=True)
`;

/**
 * The panel's requests to the server extension, as "METHOD path?query".
 */
function recordRequests(page: import('@playwright/test').Page): string[] {
  const asked: string[] = [];
  page.on('request', request => {
    const url = new URL(request.url());
    if (url.pathname.includes('/remote-compute/')) {
      asked.push(`${request.method()} ${url.pathname}${url.search}`);
    }
  });
  return asked;
}

/**
 * Open JupyterLab and wait, up to three minutes, until it and Galata's helpers are ready.
 */
async function openLab(page: IJupyterLabPageFixture): Promise<void> {
  const raw = page.context().pages()[0];
  await raw.goto('/lab', { waitUntil: 'domcontentloaded' });
  await raw.waitForFunction(
    () => typeof (window as any).jupyterapp === 'object',
    null,
    { timeout: 180000 }
  );
  await raw.evaluate(() => (window as any).jupyterapp.started);
  await raw.waitForFunction(
    () => typeof (window as any).galata?.app === 'object',
    null,
    { timeout: 60000 }
  );
}

/**
 * Every events socket of the page goes through here, so a test can take them down: `takeDown`
 * closes the open ones and refuses any new one.
 */
async function routeEventSockets(
  page: IJupyterLabPageFixture
): Promise<{ open: WebSocketRoute[]; takeDown: () => Promise<void> }> {
  let down = false;
  const open: WebSocketRoute[] = [];
  await page.routeWebSocket(/\/api\/events\/subscribe/, socket => {
    if (down) {
      void socket.close();
      return;
    }
    socket.connectToServer();
    open.push(socket);
  });
  return {
    open,
    takeDown: async () => {
      down = true;
      await Promise.all(open.map(socket => socket.close()));
    }
  };
}

const isListOrMachines = (line: string) =>
  /^GET \/remote-compute\/(jobs|machines)(\?|$)/.test(line);

test.describe('Live updates', () => {
  // Each test opens JupyterLab itself: on a loaded test machine it can take longer to start
  // than the 15 s Galata's own navigation waits.
  test.use({ autoGoto: false });

  test('charts the metrics a job logs while it still runs', async ({ page, tmpPath }) => {
    const errors: string[] = [];
    page.on('console', message => {
      if (message.type() === 'error') {
        errors.push(message.text());
      }
    });
    const name = unique('ui-metrics');
    const go = path.join(WORKSPACE, tmpPath, 'go');
    await page.contents.uploadContent(TRAIN, 'text', `${tmpPath}/train.py`);
    await openLab(page);
    await page.sidebar.openTab('jp-remote-compute-panel');
    const panel = page.locator('#jp-remote-compute-panel');
    await panel.getByRole('button', { name: 'New Job' }).click();
    const form = page.getByRole('form', { name: 'New Job' });
    await form.getByLabel('Command', { exact: true }).fill(`python ${tmpPath}/train.py ${go}`);
    await form.getByLabel('Files to send', { exact: true }).fill(`${tmpPath}/train.py`);
    await form.getByLabel('Name (optional)', { exact: true }).fill(name);
    await form.getByRole('button', { name: 'Run', exact: true }).click();

    const detail = page.getByRole('region', { name: `Job ${name}` });
    const metrics = detail.getByRole('region', { name: 'Live metrics' });
    const chart = metrics.getByRole('img', { name: /^loss: 3 points, last 0\.3333 at step 2$/ });
    await expect(chart).toBeVisible({ timeout: 90000 });
    // Charted before the job ends: it is waiting for the go file this test has not made.
    await expect(detail.getByText('running', { exact: true })).toBeVisible();
    expect(fs.existsSync(go)).toBe(false);
    await expect(chart.locator('path.jp-RemoteCompute-lineChartPath')).toHaveAttribute('d', /^M[^M]*L[^M]*L/);

    fs.writeFileSync(go, '');
    await expect(metrics.getByRole('img', { name: /^loss: 4 points, last 0\.125 at step 3$/ })).toBeVisible({
      timeout: 60000
    });
    await expect(detail.getByText('succeeded', { exact: true })).toBeVisible({ timeout: 90000 });
    await expect(page.getByRole('log', { name: /Log of job/ })).toContainText('trained');
    expect(errors.filter(text => /remote-compute|LineChart|Warning:/i.test(text))).toEqual([]);
  });

  test.describe('with the fallback poll switched off', () => {
    test.use({
      mockSettings: {
        ...galata.DEFAULT_SETTINGS,
        'jupyter-remote-compute:plugin': { fallbackPollInterval: 0 }
      }
    });

    test('the job list follows a job submitted elsewhere through pushed events', async ({ page, tmpPath }) => {
      const name = unique('ui-pushed');
      const go = path.join(WORKSPACE, tmpPath, 'go-pushed');
      fs.mkdirSync(path.dirname(go), { recursive: true });
      await openLab(page);
      await page.sidebar.openTab('jp-remote-compute-panel');
      const panel = page.locator('#jp-remote-compute-panel');
      await expect(panel.getByRole('list', { name: 'Jobs' })).toBeVisible();
      const asked = recordRequests(page);

      // Submitted from outside the panel, as a notebook or the CLI would.
      const response = await page.request.post('/remote-compute/jobs', {
        data: { command: `sh -c 'echo up; while [ ! -f ${go} ]; do sleep 0.05; done'`, name }
      });
      expect(response.status()).toBe(201);
      const row = panel.getByRole('listitem', { name });
      await expect(row).toContainText('running', { timeout: 60000 });
      fs.writeFileSync(go, '');
      await expect(row).toContainText('succeeded', { timeout: 60000 });
      // Everything came pushed: the list and the machines were never asked for again.
      expect(asked.filter(isListOrMachines)).toEqual([]);
    });
  });

  test('makes no timed requests while the event socket is up, and polls while it is down', async ({ page }) => {
    const sockets = await routeEventSockets(page);
    await openLab(page);
    await page.sidebar.openTab('jp-remote-compute-panel');
    const panel = page.locator('#jp-remote-compute-panel');
    await expect(panel.getByRole('list', { name: 'Jobs' })).toBeVisible();
    await expect.poll(() => sockets.open.length).toBeGreaterThan(0);
    const asked = recordRequests(page);

    // Longer than the fallback interval (10 s): with the socket up, not one request goes out.
    await page.waitForTimeout(12000);
    expect(asked).toEqual([]);

    // The socket drops and cannot come back: the fallback poll takes over.
    await sockets.takeDown();
    await expect.poll(() => asked.filter(isListOrMachines).length, { timeout: 30000 }).toBeGreaterThan(0);
  });

  test('a pipeline canvas reads its running run every few seconds while the event socket is down', async ({
    page,
    tmpPath
  }) => {
    const sockets = await routeEventSockets(page);
    const go = path.join(WORKSPACE, tmpPath, 'go');
    const file = `${tmpPath}/polled.rcpipeline`;
    const wait = `import os, time\nwhile not os.path.exists(${JSON.stringify(go)}):\n    time.sleep(0.05)`;
    const document = {
      version: 1,
      nodes: [
        {
          id: 'slow',
          step: 'train-on-remote-machine',
          settings: { command: ['python', '-c', wait] },
          position: { x: 0, y: 0 }
        }
      ],
      edges: []
    };
    await page.contents.uploadContent(JSON.stringify(document), 'text', file);
    await openLab(page);
    await expect.poll(() => sockets.open.length).toBeGreaterThan(0);
    await page.evaluate(async path => {
      await (window as any).jupyterapp.commands.execute('docmanager:open', {
        path,
        factory: 'Remote Compute Pipeline'
      });
    }, file);
    await page.getByRole('toolbar', { name: 'Pipeline' }).getByRole('button', { name: 'Run' }).click();
    const slow = page.getByRole('group', { name: 'Node slow' });
    await expect(slow).toHaveAttribute('data-state', 'running', { timeout: 60000 });

    // No event can arrive now: only reading the run can tell the canvas it ended.
    await sockets.takeDown();
    const asked = recordRequests(page);
    fs.writeFileSync(go, '');
    await expect(slow).toHaveAttribute('data-state', 'succeeded', { timeout: 60000 });
    await expect(page.getByRole('status').filter({ hasText: /^Run / })).toContainText('succeeded');
    expect(asked.some(line => /^GET \/remote-compute\/pipelines\/runs\/[^/]+$/.test(line))).toBe(true);
  });
});
