/**
 * The canvas as a person meets it: an empty one says what to do, a dropped step stays where it was
 * dropped (and so does the next), its settings form reads like JupyterLab's settings editor (no
 * type pickers, help once with its markdown, lists as lines) and says nothing is wrong before a
 * setting was given or a run asked for; an edge's files are never hidden under a card.
 */
import { expect, test } from '@jupyterlab/galata';
import { Locator } from '@playwright/test';

import { openPipeline, settingsField as field } from './helpers';

const TRAIN = 'Train on a Remote Machine';

async function box(locator: Locator): Promise<{ x: number; y: number; width: number; height: number }> {
  const b = await locator.boundingBox();
  expect(b).not.toBeNull();
  return b!;
}

/** Whether the element is what the page shows at its left and right ends (nothing drawn over it). */
async function onTop(locator: Locator): Promise<boolean> {
  return locator.evaluate(el => {
    const r = el.getBoundingClientRect();
    return [r.left + 2, r.right - 2].every(x => {
      const hit = document.elementFromPoint(x, r.top + r.height / 2);
      return hit !== null && el.contains(hit);
    });
  });
}

/** How far a button's background is from grey: the spread of its red, green and blue. */
async function tint(button: Locator): Promise<number> {
  const rgb = await button.evaluate(el => getComputedStyle(el).backgroundColor);
  const [r, g, b] = (rgb.match(/\d+(\.\d+)?/g) ?? []).slice(0, 3).map(Number);
  return Math.max(r, g, b) - Math.min(r, g, b);
}

test.describe('Pipeline canvas, as a person meets it', () => {
  test.use({ viewport: { width: 1400, height: 900 } });

  test('a step dropped on an empty canvas: no pan, a plain form, no problem before it is due', async ({
    page,
    tmpPath
  }) => {
    const file = `${tmpPath}/untitled.rcpipeline`;
    await page.contents.uploadContent(JSON.stringify({ version: 1, nodes: [], edges: [] }), 'text', file);
    await openPipeline(page, file);
    await page.sidebar.close('left');

    const canvas = page.getByLabel('Pipeline canvas');
    const toolbar = page.getByRole('toolbar', { name: 'Pipeline' });
    const hint = canvas.getByRole('note');
    await expect(hint).toContainText('Drag a step here');
    // Disabled looks disabled: Run with nothing to run, Cancel with nothing running.
    for (const name of ['Run', 'Cancel']) {
      const button = toolbar.getByRole('button', { name, exact: true });
      await expect(button).toBeDisabled();
      expect(Number(await button.evaluate(el => getComputedStyle(el).opacity))).toBeLessThan(0.6);
    }

    const palette = page.getByRole('list', { name: 'Steps' });
    await palette.getByRole('listitem', { name: TRAIN }).dragTo(canvas, { targetPosition: { x: 60, y: 60 } });
    const first = page.getByRole('group', { name: 'Node train', exact: true });
    await expect(first).toBeVisible();
    await expect(hint).toHaveCount(0);
    const form = page.getByRole('region', { name: 'Settings of train' });
    await expect(form).toBeVisible();
    const landed = await box(first);

    // The form: one text box per setting, whatever types its schema allows; help once, rendered.
    await expect(form.locator('option', { hasText: /^(text|list|number|none)$/ })).toHaveCount(0);
    await expect(form.getByText(/^One line for the machine/)).toHaveCount(1);
    await expect(form.locator('code', { hasText: '&&' })).toBeVisible();
    await expect(form).not.toContainText('`');
    await expect(field(page, 'train', 'timeout')).toHaveAttribute('type', 'text');
    await expect(form.getByRole('button', { name: /Move up|Move down|Remove/ })).toHaveCount(0);

    // A list takes lines; an empty one is not an entry. The node's other settings were not given
    // yet: nothing says they are missing, while the list's own problem shows.
    await field(page, 'train', 'send').fill('data.txt\n');
    const problems = page.getByRole('list', { name: 'Problems' });
    await expect(problems).toContainText("'data.txt': no upstream step brings it back");
    await expect(problems).not.toContainText('Command is required');
    await expect(problems).not.toContainText('None');
    await field(page, 'train', 'timeout').fill('2h');
    await form.getByText('Resources', { exact: true }).click();
    await field(page, 'train', 'resources_memory').fill('32G');
    await expect(problems).not.toContainText('memory');

    // A second step dropped where the canvas still shows: the view did not move.
    await palette.getByRole('listitem', { name: TRAIN }).dragTo(canvas, { targetPosition: { x: 360, y: 300 } });
    const second = page.getByRole('group', { name: 'Node train-2' });
    await expect(second).toBeVisible();
    const now = await box(first);
    expect([now.x, now.y]).toEqual([landed.x, landed.y]);
    // In the canvas's view, left of the settings pane beside it.
    const [placed, area] = await Promise.all([box(second), box(canvas)]);
    expect(placed.x).toBeGreaterThanOrEqual(area.x);
    expect(placed.x + placed.width).toBeLessThanOrEqual(area.x + area.width);
    expect(placed.y + placed.height).toBeLessThanOrEqual(area.y + area.height);

    // Run: the file is named first, and then every problem shows.
    await toolbar.getByRole('button', { name: 'Run', exact: true }).click();
    const naming = page.getByRole('dialog');
    await naming.getByRole('textbox').fill('first-try');
    await naming.getByRole('button', { name: 'Rename and Run' }).click();
    await expect(page.getByRole('tab', { name: /first-try\.rcpipeline/ })).toBeVisible();
    await expect(problems).toContainText('train, command: Command is required');
    await expect(problems).toContainText('train-2, command: Command is required');
  });

  test("an edge's files show above the cards it joins, in both themes", async ({ page, tmpPath }) => {
    const file = `${tmpPath}/edge.rcpipeline`;
    const document = {
      version: 1,
      nodes: [
        {
          id: 'prepare',
          step: 'train-on-remote-machine',
          settings: { command: 'true', bring_back: ['model.pkl', 'metrics.json', 'features.parquet'] },
          position: { x: 0, y: 0 }
        },
        {
          id: 'train',
          step: 'train-on-remote-machine',
          settings: { command: 'true', send: ['model.pkl', 'metrics.json', 'features.parquet'] },
          position: { x: 260, y: 0 }
        }
      ],
      edges: [{ from: 'prepare', to: 'train' }]
    };
    await page.contents.uploadContent(JSON.stringify(document), 'text', file);
    await openPipeline(page, file);
    const label = page.getByLabel('Pipeline canvas').getByText('model.pkl, metrics.json, features.parquet');
    await expect(label).toBeVisible();
    expect(await onTop(label)).toBe(true);
    // Selected, a card is raised: the label stays above it.
    await page.getByRole('group', { name: 'Node prepare' }).click();
    await page.getByRole('button', { name: 'Fit View' }).click(); // the form took part of the canvas
    await expect.poll(() => onTop(label)).toBe(true);

    await page.getByRole('group', { name: 'Node train' }).click();
    const form = page.getByRole('region', { name: 'Settings of train' });
    await expect(field(page, 'train', 'send')).toHaveValue('model.pkl\nmetrics.json\nfeatures.parquet');
    const main = page.locator('#jp-main-dock-panel');
    await main.screenshot({ path: test.info().outputPath('canvas-light.png') });
    // Disabled (nothing runs), Cancel is the theme's grey in both themes, not a faint red that reads as armed.
    const cancel = page.getByRole('toolbar', { name: 'Pipeline' }).getByRole('button', { name: 'Cancel', exact: true });
    await expect(cancel).toBeDisabled();
    await expect.poll(() => tint(cancel)).toBeLessThan(16);
    await page.theme.setDarkTheme();
    await expect(form).toBeVisible();
    await expect.poll(() => tint(cancel)).toBeLessThan(16);
    await main.screenshot({ path: test.info().outputPath('canvas-dark.png') });
    await page.theme.setLightTheme();
  });
});
