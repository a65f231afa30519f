/**
 * Screenshots of the Compute panel and a job's detail, light and dark, for the docs.
 * Not a test of behaviour: it runs only with UPDATE_SCREENSHOTS=1, e.g.
 *
 *   UPDATE_SCREENSHOTS=1 ui-tests/run.sh -g screenshots
 *
 * and writes docs/screenshots/*.png.
 */
import { expect, test } from '@jupyterlab/galata';
import * as path from 'path';

const OUT = path.resolve(__dirname, '..', '..', 'docs', 'screenshots');

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
    await shot(panel, 'panel-light.png');
    await shot(main, 'job-detail-light.png');

    await page.theme.setDarkTheme();
    await expect(page.locator('body')).toHaveAttribute('data-jp-theme-light', 'false');
    await shot(panel, 'panel-dark.png');
    await shot(main, 'job-detail-dark.png');
    await page.theme.setLightTheme();
    expect(job.id).toBeTruthy();
  });
});
