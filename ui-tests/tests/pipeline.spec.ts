/**
 * Pipelines on a canvas: a new pipeline from the launcher, steps dragged from the palette, their
 * settings filled through the form, connected, saved and run on the built-in machine; and the
 * problems the canvas shows before a run.
 */
import { expect, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import * as fs from 'fs';
import * as path from 'path';

import { openPipeline, settingsField as field } from './helpers';

const WORKSPACE = path.join(process.env.REMOTE_COMPUTE_UI_TMP ?? '', 'workspace');
const OUT = path.resolve(__dirname, '..', '..', 'docs', 'screenshots');
const TRAIN = 'Train on a Remote Machine';

async function fillCommand(page: IJupyterLabPageFixture, node: string, command: string): Promise<void> {
  const form = page.getByRole('region', { name: `Settings of ${node}` });
  await expect(form).toBeVisible();
  await field(page, node, 'command').fill(command);
}

/**
 * One more line in a list setting (its box takes one entry a line).
 */
async function addListItem(page: IJupyterLabPageFixture, node: string, name: string, value: string): Promise<void> {
  const box = field(page, node, name);
  const before = await box.inputValue();
  await box.fill(before ? `${before}\n${value}` : value);
}

test.describe('Pipeline canvas', () => {
  test.use({ viewport: { width: 1400, height: 900 } });

  test('is named as JupyterLab names a notebook: Pipeline in the launcher and File › New, New Pipeline in the palette', async ({
    page
  }) => {
    await page.evaluate(async () => {
      await (window as any).jupyterapp.commands.execute('launcher:create', {});
    });
    await expect(page.locator('.jp-LauncherCard:visible', { hasText: /^Pipeline$/ })).toBeVisible();

    await page.menu.openLocator('File>New');
    const newMenu = page.locator('.lm-Menu:visible').last();
    await expect(newMenu.getByRole('menuitem', { name: 'Pipeline', exact: true })).toBeVisible();
    await expect(newMenu.getByRole('menuitem', { name: /New Pipeline/ })).toHaveCount(0);
    await page.menu.closeAll();

    await page.keyboard.press('Control+Shift+C');
    const search = page.locator('#command-palette .lm-CommandPalette-input');
    await search.fill('Pipeline');
    const items = page.locator('#command-palette .lm-CommandPalette-itemLabel');
    await expect(items.filter({ hasText: /^New Pipeline$/ })).toHaveCount(1);
    await expect(items.filter({ hasText: /^Pipeline$/ })).toHaveCount(0);
  });

  test('a pipeline from the launcher: drag, fill, connect, save, run on this machine', async ({
    page,
    tmpPath
  }) => {
    await page.evaluate(async cwd => {
      await (window as any).jupyterapp.commands.execute('launcher:create', { cwd });
    }, tmpPath);
    // The launcher just opened (another, hidden, may be open behind it).
    await page.locator('.jp-LauncherCard:visible', { hasText: /^Pipeline$/ }).click();
    const tab = page.getByRole('tab', { name: /untitled.*\.rcpipeline/ });
    await expect(tab).toBeVisible();
    await page.sidebar.close('left'); // room for the palette, the canvas and the form
    const file = `${tmpPath}/${(await tab.innerText()).trim()}`;

    const palette = page.getByRole('list', { name: 'Steps' });
    const canvas = page.getByLabel('Pipeline canvas');
    // As a person sees it: the canvas takes a step once its file is read and it says so.
    await expect(page.getByRole('note').filter({ hasText: 'Drag a step here' })).toBeVisible();
    await palette.getByRole('listitem', { name: TRAIN }).dragTo(canvas, { targetPosition: { x: 40, y: 40 } });
    const first = page.getByRole('group', { name: 'Node train', exact: true });
    await expect(first).toBeVisible();
    await expect(first).toContainText('on local');
    await fillCommand(page, 'train', `python -c "open('data.txt', 'w').write('42')"`);
    await addListItem(page, 'train', 'bring_back', 'data.txt');

    await palette.getByRole('listitem', { name: TRAIN }).dragTo(canvas, { targetPosition: { x: 300, y: 260 } });
    const second = page.getByRole('group', { name: 'Node train-2' });
    await expect(second).toBeVisible();
    await fillCommand(
      page,
      'train-2',
      `python -c "open('model.txt', 'w').write(open('data.txt').read() + '!')"`
    );
    await addListItem(page, 'train-2', 'send', 'data.txt');
    await addListItem(page, 'train-2', 'bring_back', 'model.txt');

    // Before the edge: train-2 needs a file nobody provides, and the canvas says which edge to draw.
    const problems = page.getByRole('list', { name: 'Problems' });
    await expect(problems).toContainText("'data.txt': no upstream step brings it back");
    await expect(problems).toContainText('connect train → train-2');

    const from = page.getByLabel('Outputs of train', { exact: true });
    const to = page.getByLabel('Inputs of train-2');
    await from.hover();
    await page.mouse.down();
    const b = (await to.boundingBox())!;
    await page.mouse.move(b.x + b.width / 2, b.y + b.height / 2, { steps: 10 });
    await page.mouse.up();
    await expect(problems).toContainText('No problems found');
    await expect(canvas.getByText('data.txt', { exact: true })).toBeVisible(); // what the edge carries

    await page.keyboard.press('Control+s');
    await expect
      .poll(() => {
        let saved;
        try {
          saved = JSON.parse(fs.readFileSync(path.join(WORKSPACE, file), 'utf-8'));
        } catch {
          return null; // not written yet, or being written
        }
        return {
          nodes: saved.nodes.map((n: any) => [n.id, n.step, n.settings.bring_back]),
          edges: saved.edges
        };
      })
      .toEqual({
        nodes: [
          ['train', 'train-on-remote-machine', ['data.txt']],
          ['train-2', 'train-on-remote-machine', ['model.txt']]
        ],
        edges: [{ from: 'train', to: 'train-2' }]
      });

    await page.getByRole('toolbar', { name: 'Pipeline' }).getByRole('button', { name: 'Run' }).click();
    // Its first run names it: runs are listed by their file's name.
    const naming = page.getByRole('dialog');
    await expect(naming).toContainText('Name the pipeline');
    await naming.getByRole('textbox').fill('two-steps');
    await naming.getByRole('button', { name: 'Rename and Run' }).click();
    await expect(page.getByRole('tab', { name: /two-steps\.rcpipeline/ })).toBeVisible();
    await expect(first).toHaveAttribute('data-state', 'succeeded', { timeout: 120000 });
    await expect(second).toHaveAttribute('data-state', 'succeeded', { timeout: 120000 });
    await expect(page.getByRole('status')).toContainText('succeeded');
    await expect(second).toContainText('last run');
    expect(fs.readFileSync(path.join(WORKSPACE, 'model.txt'), 'utf-8')).toBe('42!');

    // Run again: nothing changed, so both nodes say their outputs were reused.
    await page.getByRole('toolbar', { name: 'Pipeline' }).getByRole('button', { name: 'Run' }).click();
    await expect(first).toHaveAttribute('data-state', 'reused', { timeout: 60000 });
    await expect(second).toHaveAttribute('data-state', 'reused', { timeout: 60000 });
    await expect(second).toContainText('outputs of its last job reused');
  });

  test('a cycle and a missing setting are shown before a run; delete, undo and redo', async ({
    page,
    tmpPath
  }) => {
    const file = `${tmpPath}/cycle.rcpipeline`;
    const document = {
      version: 1,
      nodes: [
        { id: 'a', step: 'train-on-remote-machine', settings: {}, position: { x: 0, y: 0 } },
        { id: 'b', step: 'train-on-remote-machine', settings: { command: 'true' }, position: { x: 300, y: 0 } },
        { id: 'c', step: 'no-such-step', settings: { x: 1 }, position: { x: 150, y: 200 } }
      ],
      edges: [
        { from: 'a', to: 'b' },
        { from: 'b', to: 'a' }
      ]
    };
    await page.contents.uploadContent(JSON.stringify(document), 'text', file);
    await openPipeline(page, file);

    const problems = page.getByRole('list', { name: 'Problems' });
    await expect(problems).toContainText('these nodes need each other in a cycle');
    await expect(problems).toContainText('a, command: Command is required');
    const a = page.getByRole('group', { name: 'Node a' });
    await expect(a.getByRole('alert').first()).toBeVisible();
    // A step no installed package offers stays on the canvas, named as such.
    await expect(page.getByRole('group', { name: 'Node c' })).toContainText('Unknown step no-such-step');

    // Opening a node's form fills in nothing of its own: the document stays unchanged.
    await page.getByRole('group', { name: 'Node b' }).click();
    await expect(page.getByRole('region', { name: 'Settings of b' })).toBeVisible();
    await expect(page.locator('.lm-TabBar-tab.jp-mod-current')).not.toHaveClass(/jp-mod-dirty/);

    await a.click();
    await page.keyboard.press('Delete');
    await expect(a).toHaveCount(0);
    await expect(problems).not.toContainText('cycle');
    await page.getByLabel('Pipeline canvas').click({ position: { x: 5, y: 5 } });
    await page.keyboard.press('Control+z');
    await expect(a).toBeVisible();
    await expect(problems).toContainText('cycle');
    await page.keyboard.press('Control+Shift+z');
    await expect(a).toHaveCount(0);
  });

  test('a failing first node leaves the second not run, with the reason on its card, and its log opens', async ({
    page,
    tmpPath
  }) => {
    const file = `${tmpPath}/fails.rcpipeline`;
    const document = {
      version: 1,
      nodes: [
        {
          id: 'prepare',
          step: 'train-on-remote-machine',
          settings: { command: `python -c "print('no data here'); raise SystemExit(7)"`, bring_back: ['data.txt'] },
          position: { x: 0, y: 0 }
        },
        {
          id: 'train',
          step: 'train-on-remote-machine',
          settings: { command: 'cat data.txt', send: ['data.txt'] },
          position: { x: 320, y: 0 }
        }
      ],
      edges: [{ from: 'prepare', to: 'train' }]
    };
    await page.contents.uploadContent(JSON.stringify(document), 'text', file);
    await openPipeline(page, file);
    await expect(page.getByRole('list', { name: 'Problems' })).toContainText('No problems found');
    await page.getByRole('toolbar', { name: 'Pipeline' }).getByRole('button', { name: 'Run' }).click();

    const prepare = page.getByRole('group', { name: 'Node prepare' });
    const train = page.getByRole('group', { name: 'Node train' });
    await expect(prepare).toHaveAttribute('data-state', 'failed', { timeout: 120000 });
    await expect(prepare.getByRole('note')).toContainText('exit code 7');
    await expect(train).toHaveAttribute('data-state', 'not_run');
    await expect(train.getByRole('note')).toContainText('it needs prepare, which failed');
    await expect(page.getByRole('status')).toContainText('failed');

    await prepare.getByRole('button', { name: 'Show the log of prepare' }).click();
    await expect(page.getByRole('log', { name: /Log of job/ })).toContainText('no data here');
  });

  test('files picked from the workspace: what a node sends, and its requirements file', async ({ page, tmpPath }) => {
    const file = `${tmpPath}/picked.rcpipeline`;
    const document = {
      version: 1,
      nodes: [{ id: 'train', step: 'train-on-remote-machine', settings: { command: 'true' }, position: { x: 0, y: 0 } }],
      edges: []
    };
    await page.contents.uploadContent('1,2\n', 'text', `${tmpPath}/data.csv`);
    await page.contents.uploadContent('x = 1\n', 'text', `${tmpPath}/train.py`);
    await page.contents.uploadContent('numpy\n', 'text', `${tmpPath}/requirements.txt`);
    await page.contents.uploadContent(JSON.stringify(document), 'text', file);
    await openPipeline(page, file);
    await page.getByRole('group', { name: 'Node train' }).click();
    const form = page.getByRole('region', { name: 'Settings of train' });

    // Two files at once, from the dialog that opens at the pipeline's folder.
    await form.getByRole('button', { name: 'Add files to Files to send' }).click();
    const dialog = page.locator('.jp-Dialog');
    const listing = dialog.locator('.jp-DirListing-content');
    await listing.getByText('data.csv', { exact: true }).click();
    await listing.getByText('train.py', { exact: true }).click({ modifiers: ['Control'] });
    await dialog.getByRole('button', { name: 'Select' }).click();
    await expect(dialog).toHaveCount(0);
    await expect(field(page, 'train', 'send')).toHaveValue(`${tmpPath}/data.csv\n${tmpPath}/train.py`);

    // The requirements file's dialog shows only what can be one (no .csv, no .py).
    await form.getByText('Python environment and image', { exact: true }).click();
    await form.getByRole('button', { name: 'Choose Requirements file' }).click();
    await expect(listing.getByText('requirements.txt', { exact: true })).toBeVisible();
    await expect(listing.getByText('data.csv', { exact: true })).toHaveCount(0);
    await listing.getByText('requirements.txt', { exact: true }).click();
    await dialog.getByRole('button', { name: 'Select' }).click();
    await expect(field(page, 'train', 'environment_requirements')).toHaveValue(`${tmpPath}/requirements.txt`);
    // The closed section says what it holds.
    await form.getByText('Python environment and image', { exact: true }).click();
    await expect(form.locator('summary', { hasText: 'Python environment and image' })).toContainText(
      `Requirements file: ${tmpPath}/requirements.txt`
    );

    await page.keyboard.press('Control+s');
    await expect
      .poll(() => {
        try {
          return JSON.parse(fs.readFileSync(path.join(WORKSPACE, file), 'utf-8')).nodes[0].settings;
        } catch {
          return null;
        }
      })
      .toEqual({
        command: 'true',
        environment: { requirements: `${tmpPath}/requirements.txt` },
        send: [`${tmpPath}/data.csv`, `${tmpPath}/train.py`]
      });
    await expect(page.getByRole('list', { name: 'Problems' })).toContainText('No problems found');
  });

  test("the panel lists a pipeline run live, expandable to its nodes' jobs", async ({ page, tmpPath }) => {
    const file = `${tmpPath}/listed.rcpipeline`;
    const document = {
      version: 1,
      nodes: [
        {
          id: 'make',
          step: 'train-on-remote-machine',
          settings: { command: `python -c "print('made it'); open('m.txt', 'w').write('1')"`, bring_back: ['m.txt'] },
          position: { x: 0, y: 0 }
        },
        {
          id: 'use',
          step: 'train-on-remote-machine',
          settings: { command: 'cat m.txt', send: ['m.txt'] },
          position: { x: 320, y: 0 }
        }
      ],
      edges: [{ from: 'make', to: 'use' }]
    };
    await page.contents.uploadContent(JSON.stringify(document), 'text', file);
    // The panel is open and has read the runs before this one starts: the row comes from events.
    await page.sidebar.openTab('jp-remote-compute-panel');
    const panel = page.locator('#jp-remote-compute-panel');
    await expect(panel.getByRole('heading', { name: /Jobs/ })).toBeVisible();
    await openPipeline(page, file);
    await expect(page.getByRole('list', { name: 'Problems' })).toContainText('No problems found');
    await page.getByRole('toolbar', { name: 'Pipeline' }).getByRole('button', { name: 'Run' }).click();
    const status = page.getByRole('status').filter({ hasText: /^Run / });
    await expect(status).toContainText(/Run \S+:/);
    const runId = /Run (\S+):/.exec(await status.innerText())![1];

    const row = panel.getByRole('listitem', { name: `Pipeline run ${runId}` });
    await expect(row).toBeVisible();
    await expect(row).toContainText('listed.rcpipeline');
    await expect(row).toHaveAttribute('data-state', 'succeeded', { timeout: 120000 });
    await expect(row).toContainText('2 of 2 nodes done');

    const toggle = row.getByRole('button', { name: /listed\.rcpipeline/ });
    await expect(toggle).toHaveAttribute('aria-expanded', 'false');
    await toggle.click();
    await expect(toggle).toHaveAttribute('aria-expanded', 'true');
    const make = row.getByRole('listitem', { name: 'Node make' });
    await expect(make).toHaveAttribute('data-state', 'succeeded');
    await expect(row.getByRole('listitem', { name: 'Node use' })).toHaveAttribute('data-state', 'succeeded');
    await make.getByRole('button', { name: /^Show job .* of make$/ }).click();
    await expect(page.getByRole('log', { name: /Log of job/ })).toContainText('made it');
  });

  test('a run cancelled from the canvas says who started and who cancelled it, on the run and its job, never a random id', async ({
    page,
    tmpPath
  }) => {
    const file = `${tmpPath}/cancelled.rcpipeline`;
    const document = {
      version: 1,
      nodes: [
        {
          id: 'wait',
          step: 'train-on-remote-machine',
          settings: { command: `python -c "import time; print('waiting', flush=True); time.sleep(300)"` },
          position: { x: 0, y: 0 }
        }
      ],
      edges: []
    };
    await page.contents.uploadContent(JSON.stringify(document), 'text', file);
    await page.sidebar.openTab('jp-remote-compute-panel');
    const panel = page.locator('#jp-remote-compute-panel');
    await expect(panel.getByRole('heading', { name: /Jobs/ })).toBeVisible();
    await openPipeline(page, file);
    const toolbar = page.getByRole('toolbar', { name: 'Pipeline' });
    await toolbar.getByRole('button', { name: 'Run' }).click();
    const status = page.getByRole('status').filter({ hasText: /^Run / });
    await expect(status).toContainText(/Run \S+:/);
    const runId = /Run (\S+):/.exec(await status.innerText())![1];
    const row = panel.getByRole('listitem', { name: `Pipeline run ${runId}` });
    await row.getByRole('button', { name: /cancelled\.rcpipeline/ }).click();
    const node = row.getByRole('listitem', { name: 'Node wait' });
    await expect(node).toHaveAttribute('data-state', 'running', { timeout: 60000 });

    await toolbar.getByRole('button', { name: 'Cancel' }).click();
    await expect(row).toHaveAttribute('data-state', 'cancelled', { timeout: 60000 });
    // jupyter_server names a token's visitor with a uuid4's hex: the person is whoever runs the lab.
    const randomId = /[0-9a-f]{32}/;
    await expect(row).toContainText(/cancelled by \S+/);
    await expect(row).not.toContainText(randomId);
    // Started by the same person: the run's own line names them, as the job's submitter.
    const who = /cancelled by (\S+)/.exec(await row.innerText())![1];
    await expect(row.locator('.jp-RemoteCompute-runUser')).toHaveText(`by ${who}`);
    await node.getByRole('button', { name: /^Show job .* of wait$/ }).click();
    const detail = page.getByRole('region', { name: /^Job / });
    await expect(detail.getByText('cancelled', { exact: true })).toBeVisible({ timeout: 60000 });
    await expect(detail.locator('.jp-RemoteCompute-reason')).toContainText(/cancelled by \S+/);
    await expect(detail.locator('.jp-RemoteCompute-reason')).not.toContainText(randomId);
  });

  test('a node renamed by a double-click on its title or F2 keeps its edges, and is saved', async ({
    page,
    tmpPath
  }) => {
    const file = `${tmpPath}/renamed.rcpipeline`;
    const document = {
      version: 1,
      nodes: [
        { id: 'a', step: 'train-on-remote-machine', settings: { command: 'true', bring_back: ['x.txt'] }, position: { x: 0, y: 0 } },
        { id: 'b', step: 'train-on-remote-machine', settings: { command: 'true', send: ['x.txt'] }, position: { x: 320, y: 0 } }
      ],
      edges: [{ from: 'a', to: 'b' }]
    };
    await page.contents.uploadContent(JSON.stringify(document), 'text', file);
    await openPipeline(page, file);
    await page.sidebar.close('left'); // room for both nodes beside the form
    await expect(page.getByRole('list', { name: 'Problems' })).toContainText('No problems found');

    await page.getByRole('group', { name: 'Node a', exact: true }).getByText('a', { exact: true }).dblclick();
    const box = page.getByLabel('New id of a');
    await expect(box).toBeFocused();
    await box.fill('prepare');
    await box.press('Enter');
    await expect(page.getByRole('group', { name: 'Node prepare' })).toBeVisible();
    await expect(page.getByRole('group', { name: 'Node a', exact: true })).toHaveCount(0);

    // F2 on the selected node; an id another node has is refused, and Escape leaves it as it was.
    await page.getByRole('button', { name: 'Fit View' }).click(); // the form took part of the canvas
    await page.getByRole('group', { name: 'Node b' }).getByText('b', { exact: true }).click();
    await expect(page.getByRole('region', { name: 'Settings of b' })).toBeVisible();
    await page.keyboard.press('F2');
    const second = page.getByLabel('New id of b');
    await second.fill('prepare');
    await second.press('Enter');
    await expect(page.getByRole('group', { name: 'Node b' }).getByRole('alert')).toContainText(
      'prepare is the id of another node'
    );
    await second.press('Escape');
    await expect(second).toHaveCount(0);
    await page.keyboard.press('F2');
    await page.getByLabel('New id of b').fill('train');
    await page.getByLabel('New id of b').press('Enter');
    await expect(page.getByRole('region', { name: 'Settings of train' })).toBeVisible();
    // The edge followed: nothing is missing upstream.
    await expect(page.getByRole('list', { name: 'Problems' })).toContainText('No problems found');

    await page.keyboard.press('Control+s');
    await expect
      .poll(() => {
        try {
          const saved = JSON.parse(fs.readFileSync(path.join(WORKSPACE, file), 'utf-8'));
          return { nodes: saved.nodes.map((n: any) => n.id), edges: saved.edges };
        } catch {
          return null;
        }
      })
      .toEqual({ nodes: ['prepare', 'train'], edges: [{ from: 'prepare', to: 'train' }] });

    // A rename is one step of the history.
    await page.getByLabel('Pipeline canvas').click({ position: { x: 5, y: 5 } });
    await page.keyboard.press('Control+z');
    await expect(page.getByRole('group', { name: 'Node b' })).toBeVisible();
  });

  test('a malformed file opens with a clear error and is never written', async ({ page, tmpPath }) => {
    const file = `${tmpPath}/broken.rcpipeline`;
    const text = '{"version": 1, "nodes": [';
    await page.contents.uploadContent(text, 'text', file);
    await openPipeline(page, file);
    await expect(page.getByRole('alert').filter({ hasText: 'cannot be drawn' })).toContainText('not JSON');
    await expect(page.getByRole('listitem', { name: TRAIN })).toHaveAttribute('draggable', 'false');
    const onDisk = path.join(WORKSPACE, file);
    const written = fs.statSync(onDisk).mtimeMs;
    await page.keyboard.press('Control+s');
    // The save is answered (not written) before the file is looked at: no read can fall mid-write.
    await expect(page.getByText('broken.rcpipeline was not saved')).toBeVisible();
    expect(fs.readFileSync(onDisk, 'utf-8')).toBe(text);
    expect(fs.statSync(onDisk).mtimeMs).toBe(written);
  });

  test('screenshots of a pipeline, light and dark', async ({ page, tmpPath }) => {
    test.skip(!process.env.UPDATE_SCREENSHOTS, 'set UPDATE_SCREENSHOTS=1 to refresh docs/screenshots');
    const file = `${tmpPath}/train.rcpipeline`;
    const command = (code: string) => `python -c "${code}"`;
    const document = {
      version: 1,
      nodes: [
        {
          id: 'prepare',
          step: 'train-on-remote-machine',
          settings: { command: command("open('data.csv', 'w').write('1,2')"), bring_back: ['data.csv'] },
          position: { x: 0, y: 0 }
        },
        {
          id: 'train',
          step: 'train-on-remote-machine',
          settings: {
            command: command("open('model.pkl', 'w').write(open('data.csv').read())"),
            send: ['data.csv'],
            bring_back: ['model.pkl']
          },
          position: { x: 320, y: 0 }
        }
      ],
      edges: [{ from: 'prepare', to: 'train' }]
    };
    await page.contents.uploadContent(JSON.stringify(document), 'text', file);
    await openPipeline(page, file);
    await page.getByRole('toolbar', { name: 'Pipeline' }).getByRole('button', { name: 'Run' }).click();
    await expect(page.getByRole('group', { name: 'Node train' })).toHaveAttribute('data-state', /succeeded|reused/, {
      timeout: 120000
    });
    await page.getByRole('group', { name: 'Node train' }).click();
    await page.getByRole('button', { name: 'Fit View' }).click();
    // The jobs' own notifications would cover the form.
    await page.addStyleTag({ content: '.Toastify { display: none !important; }' });
    fs.mkdirSync(OUT, { recursive: true });
    const main = page.locator('#jp-main-dock-panel');
    await main.screenshot({ path: path.join(OUT, 'pipeline-light.png') });
    await page.theme.setDarkTheme();
    await main.screenshot({ path: path.join(OUT, 'pipeline-dark.png') });
    await page.theme.setLightTheme();
  });
});
