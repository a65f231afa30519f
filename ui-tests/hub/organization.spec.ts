/**
 * Teams on JupyterHub in the browser: a member logs in through the hub's login form, runs a job on the
 * organization's machine from the Compute panel, sees her quota's notice on it, and another member
 * cannot see it; the admin names the organization's default machine in the panel's Organization section and
 * limits the machine to a group in its form. Against the hub that
 * tests/hub_ui.py starts (HUB_URL), its users' servers spawned by the logins, as real Linux users.
 */
import { APIRequestContext, Browser, expect, Locator, Page, test } from '@playwright/test';

const HUB = process.env.HUB_URL ?? '';
const PASSWORD = process.env.HUB_PASSWORD ?? '';
const MACHINE = process.env.HUB_MACHINE ?? '';

/** A name no earlier run used: the users' homes, and their job lists, outlive a run. */
function unique(prefix: string): string {
  return `${prefix}-${Date.now().toString(36)}${Math.floor(Math.random() * 1000)}`;
}

/** Log in through the hub's form in a browser of the user's own; their server is spawned, JupyterLab opens. */
async function logIn(browser: Browser, user: string): Promise<Page> {
  const context = await browser.newContext();
  const page = await context.newPage();
  await page.goto(`${HUB}hub/login`);
  await page.locator('#username_input').fill(user);
  await page.locator('#password_input').fill(PASSWORD);
  await page.locator('#login_submit').click();
  // The hub spawns the server, waits on it, then sends the browser to its JupyterLab.
  await page.waitForURL(new RegExp(`/user/${user}/lab`), { timeout: 120000 });
  // The default layout: the users' homes keep JupyterLab's workspace (what an earlier run left open).
  await page.goto(`${HUB}user/${user}/lab?reset`);
  return page;
}

/** The Compute panel, once it has read the machines (the jobs come with them). */
async function openPanel(page: Page): Promise<Locator> {
  const tab = page.locator('.lm-TabBar-tab[data-id="jp-remote-compute-panel"]');
  await expect(tab).toBeVisible({ timeout: 120000 });
  if ((await tab.getAttribute('aria-selected')) !== 'true') {
    await tab.click();
  }
  const panel = page.locator('#jp-remote-compute-panel');
  await expect(panel.getByRole('heading', { name: 'Machines' })).toBeVisible({ timeout: 60000 });
  return panel;
}

/** The user's jobs of that name, as their own server's REST API lists them (the browser's hub cookie). */
async function jobsNamed(request: APIRequestContext, user: string, name: string): Promise<any[]> {
  const answer = await request.get(`${HUB}user/${user}/remote-compute/jobs?name=${encodeURIComponent(name)}`);
  expect(answer.ok(), await answer.text()).toBeTruthy();
  return (await answer.json()).jobs;
}

test('a member runs a job on the organization machine through the hub login and sees its quota notice; another cannot see it; the admin names the default machine, who may use it, the tracking server and a secret of the organization', async ({
  browser
}) => {
  expect(HUB, 'HUB_URL: run this spec with tests/hub_ui.py').not.toBe('');
  const name = unique('hub-ui');

  // rcalice sees the organization's machine, marked as the organization's, read-only for her.
  const alice = await logIn(browser, 'rcalice');
  const panel = await openPanel(alice);
  const machines = panel.getByRole('list', { name: "The organization's machines" });
  const row = machines.getByRole('listitem', { name: MACHINE });
  await expect(row).toBeVisible();
  await expect(row).toContainText('set by rcadmin');
  await expect(row.getByRole('button', { name: `Check ${MACHINE}` })).toHaveCount(0);

  // She runs a job there from the New Job form; it runs through the service and succeeds.
  await panel.getByRole('button', { name: 'New Job' }).click();
  const form = alice.getByRole('form', { name: 'New Job' });
  await expect(form).toBeVisible();
  const machine = form.getByLabel('Machine', { exact: true });
  await expect(machine.locator(`option[value="org:${MACHINE}"]`)).toContainText('organization');
  await machine.selectOption(`org:${MACHINE}`);
  // It runs until the organization's notice of her soft quota (about a second of job-hours) is in its log.
  const command = `until grep -q 'organization] notice' ../log; do sleep 0.2; done; echo ${name} ran as $(id -un)`;
  await form.getByLabel('Command', { exact: true }).fill(command);
  await form.getByLabel('Name (optional)', { exact: true }).fill(name);
  await form.getByRole('button', { name: 'Run', exact: true }).click();
  const detail = alice.getByRole('region', { name: `Job ${name}` });
  await expect(detail).toBeVisible();
  await expect(detail.getByText('succeeded', { exact: true })).toBeVisible({ timeout: 180000 });
  await expect(alice.getByRole('log', { name: /Log of job/ })).toContainText(`${name} ran as`);
  await expect(panel.getByRole('list', { name: 'Jobs' }).getByRole('listitem', { name })).toContainText(
    'succeeded'
  );
  const [job] = await jobsNamed(alice.request, 'rcalice', name);
  expect(job.machine).toBe(`org:${MACHINE}`);
  // The notice is on her job: in its detail in the panel, and in its JSON.
  const quota = "user rcalice's job_hours soft quota: ";
  await expect(detail.getByRole('list', { name: "The organization's notices" })).toContainText(quota);
  const shown = await alice.request.get(`${HUB}user/rcalice/remote-compute/jobs/${job.id}`);
  expect(shown.ok(), await shown.text()).toBeTruthy();
  const notices: string[] = (await shown.json()).notices;
  expect(notices.length === 1 && notices[0].startsWith(quota), JSON.stringify(notices)).toBeTruthy();

  // rcbob, of the same group, sees the machine and none of her job: not in his list, nor in his search,
  // and her server refuses him.
  const bob = await logIn(browser, 'rcbob');
  const bobsPanel = await openPanel(bob);
  await expect(bobsPanel.getByRole('list', { name: "The organization's machines" })).toContainText(MACHINE);
  await bobsPanel.getByRole('searchbox', { name: 'Search jobs by name' }).fill(name);
  await expect(bobsPanel.getByText('No job matches the filters.')).toBeVisible();
  await expect(bobsPanel.getByRole('listitem', { name })).toHaveCount(0);
  expect(await jobsNamed(bob.request, 'rcbob', name)).toEqual([]);
  const hers = await bob.request.get(`${HUB}user/rcalice/remote-compute/jobs/${job.id}`, { maxRedirects: 0 });
  expect(hers.status(), await hers.text()).not.toBe(200);
  expect(await hers.text()).not.toContain(name);

  // rcadmin's panel has the Organization section: he names the machine the default for everyone, which
  // the New Job form then preselects (it is no longer listed among the machines), and clears it.
  const admin = await logIn(browser, 'rcadmin');
  const adminsPanel = await openPanel(admin);
  const section = adminsPanel.getByRole('region', { name: 'Organization' });
  const choice = section.getByLabel('Default machine', { exact: true });
  await choice.selectOption(MACHINE);
  await expect(adminsPanel.getByRole('list', { name: "The organization's machines" })).toHaveCount(0);
  await adminsPanel.getByRole('button', { name: 'New Job' }).click();
  const adminsForm = admin.getByRole('form', { name: 'New Job' });
  await expect(adminsForm.getByLabel('Machine', { exact: true })).toHaveValue(`org:${MACHINE}`);
  await choice.selectOption('');
  await expect(adminsPanel.getByRole('list', { name: "The organization's machines" })).toContainText(MACHINE);
  await expect(choice).toHaveValue('');

  // In the machine's form he says who may use it (the group rcteam), which its row then shows, and lifts it.
  const adminsMachines = adminsPanel.getByRole('list', { name: "The organization's machines" });
  const adminsRow = adminsMachines.getByRole('listitem', { name: MACHINE });
  const setGroups = async (groups: string): Promise<void> => {
    await adminsRow.getByRole('button', { name: `More actions for ${MACHINE}` }).click();
    await admin.getByRole('menuitem', { name: `Edit the Organization's Machine ${MACHINE}` }).click();
    const edit = admin.getByRole('form', { name: `Edit Machine ${MACHINE}` });
    await edit.getByLabel('Groups (optional)', { exact: true }).fill(groups);
    await edit.getByRole('button', { name: 'Save', exact: true }).click();
    await expect(edit).toHaveCount(0);
  };
  await setGroups('rcteam');
  await expect(adminsRow).toContainText('for group rcteam');
  const listed = await admin.request.get(`${HUB}user/rcadmin/remote-compute/machines`);
  const mine = (await listed.json()).machines.find((m: any) => m.name === MACHINE);
  expect(mine.access).toEqual({ users: [], groups: ['rcteam'] });
  await setGroups('');
  await expect(adminsRow).not.toContainText('for group');

  // He names the organization's tracking server in the section, which the service then holds; a URL with
  // a password in it is refused naming the field and echoing none of it; emptied, Clear clears it.
  const tracking = section.getByRole('form', { name: 'Tracking server' });
  const field = tracking.getByLabel('Tracking server', { exact: true });
  const kept = async (): Promise<unknown> =>
    (await (await admin.request.get(`${HUB}user/rcadmin/remote-compute/organization/tracking`)).json()).uri;
  await field.fill('http://127.0.0.1:5000/');
  await tracking.getByRole('button', { name: 'Save', exact: true }).click();
  await expect.poll(kept).toBe('http://127.0.0.1:5000');
  await expect(field).toHaveValue('http://127.0.0.1:5000');
  await field.fill('http://admin:hub-pass-3e9d@127.0.0.1:5000');
  await tracking.getByRole('button', { name: 'Save', exact: true }).click();
  const refusal = section.getByRole('alert');
  await expect(refusal).toContainText('uri: no user or password in the URL');
  await expect(refusal).not.toContainText('hub-pass-3e9d');
  expect(await kept()).toBe('http://127.0.0.1:5000');
  await field.fill('');
  await tracking.getByRole('button', { name: 'Clear', exact: true }).click();
  await expect.poll(kept).toBeNull();

  // He stores a secret of the organization's (what a machine's registry_secret names): the service holds it,
  // the section lists its name, and no page, listing or answer carries its value; then he deletes it.
  const secrets = section.getByRole('region', { name: "The organization's secrets" });
  await secrets.getByRole('button', { name: /^Add a secret/ }).click();
  const adding = secrets.getByRole('form', { name: 'Add a secret' });
  await adding.getByLabel('Secret name', { exact: true }).fill('team/panel-registry');
  await adding.getByLabel('Secret value', { exact: true }).fill('rc:org-pass-5c1f');
  await adding.getByRole('button', { name: 'Save', exact: true }).click();
  const entry = secrets.locator('[data-name="team/panel-registry"]');
  await expect(entry).toBeVisible();
  const names = await admin.request.get(`${HUB}user/rcadmin/remote-compute/organization/secrets`);
  expect((await names.json()).secrets.map((x: any) => x.name)).toContain('team/panel-registry');
  expect(await names.text()).not.toContain('org-pass-5c1f');
  expect(await admin.content()).not.toContain('org-pass-5c1f');
  await entry.getByRole('button', { name: 'Delete team/panel-registry' }).click();
  await admin.getByRole('dialog').getByRole('button', { name: 'Delete', exact: true }).click();
  await expect(entry).toHaveCount(0);
});
