/**
 * The spec through JupyterHub's login (hub/): against the hub that tests/hub_ui.py starts and names in
 * HUB_URL, with the browser settings of playwright.config.js and no JupyterLab server of its own.
 */
const main = require('./playwright.config');

module.exports = {
  ...main,
  testDir: 'hub',
  // Two logins, each spawning a server, and a job on the organization's machine between them.
  timeout: 300000,
  // No retry: a pytest session's hub tests wait on this run for the test users (tests/hub_ui.py).
  retries: 0,
  webServer: undefined,
  // With no retry, a failure's trace is kept from its only run.
  use: { ...main.use, trace: 'retain-on-failure', baseURL: process.env.HUB_URL }
};
