/**
 * Screenshots of the Compute panel and a job's detail, light and dark, for the docs.
 * Not a test of behaviour: it runs only with UPDATE_SCREENSHOTS=1, e.g.
 *
 *   UPDATE_SCREENSHOTS=1 ui-tests/run.sh -g screenshots
 *
 * and writes docs/screenshots/*.png.
 */
import { expect, test } from '@jupyterlab/galata';
import * as fs from 'fs';
import * as path from 'path';

const OUT = path.resolve(__dirname, '..', '..', 'docs', 'screenshots');
const JOBS_JSON = path.join(process.env.REMOTE_COMPUTE_UI_TMP ?? '', 'workspace', '.punica', 'jobs.json');

const TRAIN = `import time
for epoch in range(1, 6):
    print(f"\\x1b[32mepoch {epoch}/5\\x1b[0m loss={1.0 / epoch:.4f} acc={0.5 + epoch / 12:.3f}", flush=True)
    time.sleep(0.3)
open("model.txt", "w").write("weights\\n")
print("saved model.txt", flush=True)
`;

test.describe('screenshots', () => {
  test.skip(!process.env.UPDATE_SCREENSHOTS, 'set UPDATE_SCREENSHOTS=1 to refresh docs/screenshots');
  test.use({ autoGoto: true, viewport: { width: 1280, height: 800 } });

  test('screenshots of the panel and a job', async ({ page, tmpPath }) => {
    const api = async (method: string, url: string, data?: unknown) => {
      const response = await page.request.fetch(`/remote-compute/${url}`, { method, data });
      expect(response.ok(), await response.text()).toBeTruthy();
      return response.status() === 204 ? null : response.json();
    };
    const { version } = await api('GET', 'machines');
    await api('POST', 'machines', {
      name: 'gpu-box',
      kind: 'ssh',
      address: 'gpu-box.lab',
      options: { user: 'ana', port: 22 },
      version
    });
    const again = await api('GET', 'machines');
    await api('POST', 'machines', {
      name: 'team-lab',
      kind: 'jupyter',
      address: 'https://hub.example.org/user/ana/',
      token: 'screenshot-only-token',
      version: again.version
    });

    await page.contents.uploadContent(TRAIN, 'text', `${tmpPath}/train.py`);
    await api('POST', 'jobs', {
      machine: 'local',
      command: `python -c "import sys; print('loading data'); print('loss is nan', file=sys.stderr); sys.exit(3)"`,
      name: 'lr-sweep-0.1'
    });
    await api('POST', 'jobs', {
      machine: 'local',
      command: 'sleep 600',
      name: 'long-run'
    });
    const { job } = await api('POST', 'jobs', {
      machine: 'local',
      command: `python ${tmpPath}/train.py`,
      send: [`${tmpPath}/train.py`],
      bring_back: ['model.txt'],
      env: { EPOCHS: '5' },
      name: 'train-resnet'
    });

    await page.sidebar.openTab('jp-remote-compute-panel');
    const panel = page.locator('#jp-remote-compute-panel');
    await panel.getByRole('button', { name: 'Check This machine' }).click();
    await expect(panel.getByText(/Check passed/)).toBeVisible();
    await expect(panel.getByRole('listitem', { name: 'train-resnet' })).toContainText('succeeded', {
      timeout: 60000
    });
    await expect(panel.getByRole('listitem', { name: 'lr-sweep-0.1' })).toContainText('failed');
    await expect(panel.getByRole('listitem', { name: 'long-run' })).toContainText('running');

    await panel.getByRole('listitem', { name: 'train-resnet' }).click();
    const detail = page.getByRole('region', { name: 'Job train-resnet' });
    await expect(detail.getByRole('link', { name: 'model.txt' })).toBeVisible();
    await expect(page.getByRole('log', { name: /Log of job/ })).toContainText('saved model.txt');
    // Let the toasts go.
    for (const button of await page.getByRole('button', { name: 'Hide notification' }).all()) {
      await button.click({ timeout: 1000 }).catch(() => undefined);
    }
    await page.mouse.move(1200, 10);

    const main = page.locator('#jp-main-dock-panel');
    // Toasts still sliding in or out are not part of the picture.
    const shot = (locator: typeof main, name: string) =>
      locator.screenshot({
        path: path.join(OUT, name),
        style: '.Toastify { display: none !important; }'
      });
    // A job's detail (job-detail-*.png) is taken by mlflow.spec.ts, of a job still running.
    await shot(panel, 'panel-light.png');

    await page.theme.setDarkTheme();
    await expect(page.locator('body')).toHaveAttribute('data-jp-theme-light', 'false');
    await shot(panel, 'panel-dark.png');
    await page.theme.setLightTheme();
    expect(job.id).toBeTruthy();
  });

  test('screenshot of a pending Slurm job with its reason', async ({ page }) => {
    // A prepared state file, not a live cluster: a slurm machine whose login node does not answer
    // (port 9 on loopback), and one job of it as the engine leaves it when Slurm says PENDING
    // (Resources). Polls fail to connect, which is not an end, so the job stays pending as written.
    const api = async (method: string, url: string, data?: unknown) => {
      const response = await page.request.fetch(`/remote-compute/${url}`, { method, data });
      expect(response.ok(), await response.text()).toBeTruthy();
      return response.json();
    };
    const { version } = await api('GET', 'machines');
    await api('POST', 'machines', {
      name: 'hpc',
      kind: 'slurm',
      address: '127.0.0.1',
      options: { user: 'ana', port: 9, base_dir: '/shared/ana/.jupyter-remote-compute', partition: 'gpu' },
      version
    });
    const id = '20261130-093000-5f1c2a';
    const now = new Date().toISOString().replace(/\.\d+Z$/, '.000Z');
    const spec = {
      machine: 'hpc',
      command: ['python', 'train.py', '--epochs', '40'],
      send: ['train.py', 'data/'],
      bring_back: ['checkpoints/'],
      env: {},
      timeout: 14400,
      name: 'resnet-4gpu',
      key: null,
      resources: { gpus: 4, cpus: 16, memory: '64G', partition: 'gpu' }
    };
    const job = {
      id,
      key: 'screenshot',
      machine: 'hpc',
      kind: 'slurm',
      spec,
      state: 'pending',
      reason: 'waiting for resources: the nodes it needs are busy',
      created: now,
      updated: now,
      started: now,
      ended: null,
      machine_snapshot: { kind: 'slurm', address: '127.0.0.1', options: { port: 9 } },
      handle: { dir: `/shared/ana/.jupyter-remote-compute/${id}`, slurm_job_id: '48213' },
      exit_code: null,
      outcome: null,
      cancel_requested: null,
      outputs: {},
      inputs: { files: 3, bytes: 48213 },
      transfer: {},
      mlflow_run_id: null,
      log_size: 0,
      lease: null,
      retries: 0,
      failing_since: null
    };
    const state = fs.existsSync(JOBS_JSON) ? JSON.parse(fs.readFileSync(JOBS_JSON, 'utf-8')) : { schema: 1, jobs: {} };
    state.jobs[id] = job;
    fs.writeFileSync(`${JOBS_JSON}.tmp`, JSON.stringify(state));
    fs.renameSync(`${JOBS_JSON}.tmp`, JOBS_JSON);

    await page.sidebar.openTab('jp-remote-compute-panel');
    const panel = page.locator('#jp-remote-compute-panel');
    await panel.getByRole('button', { name: /Refresh machines and jobs/ }).click();
    const row = panel.getByRole('listitem', { name: 'resnet-4gpu' });
    await expect(row).toContainText('pending');
    await expect(row).toContainText('waiting for resources');
    await row.click();
    await expect(page.getByRole('region', { name: 'Job resnet-4gpu' })).toContainText('waiting for resources');
    await page.mouse.move(1200, 10);
    const style = '.Toastify { display: none !important; }';
    await panel.screenshot({ path: path.join(OUT, 'slurm-pending-panel.png'), style });
    await page.locator('#jp-main-dock-panel').screenshot({ path: path.join(OUT, 'slurm-pending-detail.png'), style });
  });
});
