/**
 * Small helpers the UI specs share.
 */
import { expect, IJupyterLabPageFixture } from '@jupyterlab/galata';
import { Locator } from '@playwright/test';

/** A name no earlier run of a test used: `<prefix>-<time><random>`. */
export function unique(prefix: string): string {
  return `${prefix}-${Date.now().toString(36)}${Math.floor(Math.random() * 1000)}`;
}

/** A call of the server extension's REST API that must succeed: its JSON answer (null for 204). */
export async function api(page: IJupyterLabPageFixture, method: string, url: string, data?: unknown): Promise<any> {
  const response = await page.request.fetch(`/remote-compute/${url}`, { method, data });
  expect(response.ok(), await response.text()).toBeTruthy();
  return response.status() === 204 ? null : response.json();
}

/** Open a pipeline file on its canvas (the widget is not returned: it does not serialize). */
export async function openPipeline(page: IJupyterLabPageFixture, file: string): Promise<void> {
  await page.evaluate(async path => {
    await (window as any).jupyterapp.commands.execute('docmanager:open', {
      path,
      factory: 'Remote Compute Pipeline'
    });
  }, file);
}

/** A node's settings field for `name` (rjsf ids are `<prefix>_<name>`, `environment_requirements` inside a group). */
export function settingsField(page: IJupyterLabPageFixture, node: string, name: string): Locator {
  return page.locator(`[id="rc-pipeline-${node}_${name}"]`);
}
