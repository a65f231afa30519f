/**
 * The questions the commands ask a person: pick a job, confirm a removal, trust a host key.
 *
 * Each resolves to the answer (or null when the person cancelled); none acts on it.
 */
import { Dialog, InputDialog, showDialog } from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';

import { IJob } from './api';
import { asAPIError } from './model';

function jobLabel(job: IJob): string {
  return `${job.name || job.id} — ${job.machine} — ${job.state} (${job.id})`;
}

/**
 * Ask the user to pick a job from a list; resolves to its id or null.
 */
export async function pickJob(
  jobs: readonly IJob[],
  title: string,
  trans: TranslationBundle
): Promise<string | null> {
  if (jobs.length === 0) {
    await showDialog({
      title,
      body: trans.__('There is no job to choose from.'),
      buttons: [Dialog.okButton({ label: trans.__('OK') })]
    });
    return null;
  }
  const shown = jobs.slice(0, 500);
  const labels = shown.map(jobLabel);
  const result = await InputDialog.getItem({
    title,
    label: trans.__('Job'),
    items: labels,
    current: 0,
    okLabel: trans.__('Choose'),
    cancelLabel: trans.__('Cancel')
  });
  if (!result.button.accept || result.value === null) {
    return null;
  }
  const index = labels.indexOf(result.value);
  return index >= 0 ? shown[index].id : null;
}

export function showError(
  title: string,
  error: unknown,
  trans: TranslationBundle
): void {
  const apiError = asAPIError(error);
  void showDialog({
    title,
    body: apiError.message,
    buttons: [Dialog.okButton({ label: trans.__('OK') })]
  });
}

async function confirm(
  title: string,
  body: string,
  keep: string,
  act: string
): Promise<boolean> {
  const result = await showDialog({
    title,
    body,
    buttons: [
      Dialog.cancelButton({ label: keep }),
      Dialog.warnButton({ label: act })
    ]
  });
  return result.button.accept;
}

export function confirmRemovePool(
  name: string,
  trans: TranslationBundle
): Promise<boolean> {
  return confirm(
    trans.__('Remove pool %1?', name),
    trans.__(
      'Its machines stay. A job waiting in its line waits until a pool of that name is back, or is cancelled.'
    ),
    trans.__('Cancel'),
    trans.__('Remove')
  );
}

export function confirmRemoveMachine(
  name: string,
  trans: TranslationBundle,
  organization = false
): Promise<boolean> {
  return confirm(
    organization
      ? trans.__("Remove the organization's machine %1?", name)
      : trans.__('Remove machine %1?', name),
    organization
      ? trans.__(
          "No member can run a job on it any more. Its jobs and the organization's usage records stay."
        )
      : trans.__(
          'The machine is removed from compute.yaml. Its jobs and their records stay.'
        ),
    trans.__('Cancel'),
    trans.__('Remove')
  );
}

export function confirmTrustHost(
  name: string,
  hostKey: { type: string; fingerprint: string },
  trans: TranslationBundle
): Promise<boolean> {
  return confirm(
    trans.__('Trust the host key of %1?', name),
    trans.__(
      "The machine presents this %1 key:\n\n%2\n\nTrust it only if it matches the fingerprint the machine's administrator gave you. It will be added to known_hosts.",
      hostKey.type,
      hostKey.fingerprint
    ),
    trans.__('Cancel'),
    trans.__('Trust this host')
  );
}

/**
 * Why a check failed: the server's error, or the answer that the machine could not be reached.
 */
export interface ICheckFailure {
  message: string;
  code: string;
  field?: string | null;
}

/**
 * The whole answer of a failed check; resolves to true when the person asked to edit the machine.
 */
export async function showCheckFailure(
  name: string,
  failure: ICheckFailure,
  trans: TranslationBundle
): Promise<boolean> {
  const result = await showDialog({
    title: trans.__('Check of %1 failed', name),
    body: `${failure.message}\n\n(${failure.code}${
      failure.field ? `, ${failure.field}` : ''
    })`,
    buttons: [
      Dialog.cancelButton({ label: trans.__('Close') }),
      Dialog.okButton({ label: trans.__('Edit Machine') })
    ]
  });
  return result.button.accept;
}

export function confirmCancelJob(
  name: string,
  machine: string | undefined,
  trans: TranslationBundle
): Promise<boolean> {
  return confirm(
    trans.__('Cancel job %1?', name),
    trans.__(
      'The job is stopped on %1 (TERM, then KILL after a grace period). Outputs are not brought back.',
      machine ?? trans.__('its machine')
    ),
    trans.__('Keep Running'),
    trans.__('Cancel Job')
  );
}

export function confirmDeleteJob(
  name: string,
  trans: TranslationBundle
): Promise<boolean> {
  return confirm(
    trans.__('Delete job %1?', name),
    trans.__(
      'The job record and its scratch data are deleted. Outputs already in the workspace and the MLflow run stay.'
    ),
    trans.__('Cancel'),
    trans.__('Delete')
  );
}

/**
 * How old a finished job must be to be forgotten (`90d`, `12h`), or null.
 */
export async function askPruneAge(
  trans: TranslationBundle
): Promise<string | null> {
  const asked = await InputDialog.getText({
    title: trans.__('Forget Old Finished Jobs'),
    label: trans.__(
      'Finished more than this long ago (e.g. 90d, 12h). Active jobs and MLflow runs are kept.'
    ),
    text: '90d',
    okLabel: trans.__('Forget'),
    cancelLabel: trans.__('Cancel')
  });
  return asked.button.accept && asked.value ? asked.value.trim() : null;
}
