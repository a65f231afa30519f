/**
 * Small helpers the UI specs share.
 */
import { expect, IJupyterLabPageFixture } from '@jupyterlab/galata';

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
