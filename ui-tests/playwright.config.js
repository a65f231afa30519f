/**
 * Galata (Playwright) configuration: Debian's chromium-headless-shell (the headless build Playwright
 * itself runs headless tests in), nothing downloaded, no video (Playwright's video needs its own
 * ffmpeg download).
 */
const fs = require('fs');
const os = require('os');
const path = require('path');
const baseConfig = require('@jupyterlab/galata/lib/playwright-config');

// One temp dir shared by the server (jupyter_server_test_config.py) and the tests, which
// read compute.yaml back from it. run.sh sets it; a bare `jlpm playwright test` gets one here.
if (!process.env.REMOTE_COMPUTE_UI_TMP) {
  process.env.REMOTE_COMPUTE_UI_TMP = fs.mkdtempSync(
    path.join(os.tmpdir(), 'remote-compute-ui-')
  );
}

module.exports = {
  ...baseConfig,
  // Only the specs of tests/: hub/ holds the spec through JupyterHub's login (playwright.hub.config.js).
  testDir: 'tests',
  timeout: 120000,
  expect: { timeout: 30000 },
  retries: process.env.CI ? 1 : 0,
  workers: 1,
  use: {
    ...baseConfig.use,
    video: 'off',
    // A trace records screencast frames of every action: recorded for every test, it cost about a third
    // of the UI run's CPU (tests/README.md). A test that fails is run again, and its retry is traced.
    trace: 'on-first-retry',
    launchOptions: {
      executablePath: process.env.CHROMIUM_PATH || '/usr/bin/chromium-headless-shell',
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-dev-shm-usage',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--no-first-run'
      ]
    }
  },
  webServer: {
    command: 'jlpm start',
    url: 'http://127.0.0.1:8888/lab',
    timeout: 120 * 1000,
    reuseExistingServer: !process.env.CI
  }
};
