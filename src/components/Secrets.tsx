/**
 * The Secrets section of the Compute panel: the names of stored secrets (never their values),
 * add one, replace or delete one. Password inputs are uncontrolled and emptied after each save,
 * so a value never stays in the page (not in React state, not in a `value` attribute).
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';
import {
  addIcon,
  Button,
  deleteIcon,
  editIcon,
  refreshIcon,
  ToolbarButtonComponent
} from '@jupyterlab/ui-components';
import * as React from 'react';

import {
  deleteSecret,
  ISecretEntry,
  ISecrets,
  SecretsOwner,
  setSecret,
  getSecrets
} from '../api';
import { asAPIError } from '../model';

/**
 * A name and a password field; `onSave` gets the value, the field is emptied whatever happens.
 */
function SecretEditor(props: {
  trans: TranslationBundle;
  owner: SecretsOwner;
  name?: string;
  onSave: (name: string, value: string) => Promise<void>;
  onCancel: () => void;
}): JSX.Element {
  const { trans } = props;
  const valueRef = React.useRef<HTMLInputElement>(null);
  const [name, setName] = React.useState(props.name ?? '');
  const [error, setError] = React.useState<string | null>(null);
  const [busy, setBusy] = React.useState(false);
  const replacing = props.name !== undefined;
  const idBase = `jp-RemoteCompute-${props.owner}-secret-${replacing ? 'replace' : 'add'}`;

  const save = async (): Promise<void> => {
    const input = valueRef.current;
    const value = input?.value ?? '';
    if (input) {
      input.value = '';
    }
    if (!name.trim()) {
      setError(trans.__('A name is required.'));
      return;
    }
    if (!value) {
      setError(trans.__('Type the secret’s value.'));
      return;
    }
    setBusy(true);
    setError(null);
    try {
      await props.onSave(name.trim(), value);
    } catch (e) {
      setError(asAPIError(e).message);
    } finally {
      setBusy(false);
    }
  };

  return (
    <form
      className="jp-RemoteCompute-secretEditor"
      aria-label={
        replacing
          ? trans.__('Replace secret %1', props.name ?? '')
          : trans.__('Add a secret')
      }
      onSubmit={e => {
        e.preventDefault();
        void save();
      }}
    >
      {!replacing && (
        <input
          id={`${idBase}-name`}
          className="jp-mod-styled"
          type="text"
          aria-label={trans.__('Secret name')}
          placeholder={trans.__('Name, e.g. team/hf-token')}
          autoComplete="off"
          spellCheck={false}
          value={name}
          onChange={e => setName(e.target.value)}
        />
      )}
      <input
        id={`${idBase}-value`}
        ref={valueRef}
        className="jp-mod-styled"
        type="password"
        aria-label={trans.__('Secret value')}
        placeholder={
          replacing ? trans.__('New value') : trans.__('Value (hidden)')
        }
        autoComplete="new-password"
      />
      <div className="jp-RemoteCompute-formButtons">
        <Button type="submit" className="jp-mod-accept" disabled={busy}>
          {trans.__('Save')}
        </Button>
        <Button type="button" minimal onClick={props.onCancel}>
          {trans.__('Cancel')}
        </Button>
      </div>
      {error && (
        <div className="jp-RemoteCompute-fieldError" role="alert">
          {error}
        </div>
      )}
    </form>
  );
}

/**
 * Where a secret lives, as a one-word badge; the full place is its tooltip.
 */
function placeBadge(secret: ISecretEntry, trans: TranslationBundle): string {
  switch (secret.source) {
    case 'keyring':
      return trans.__('keyring');
    case 'file':
      return trans.__('file');
    default:
      return trans.__('deployment');
  }
}

/**
 * The secrets of one Secret Manager: the user's own (a section of the panel), or the organization
 * service's (a part of an admin's Organization section).
 */
export function Secrets(props: {
  trans: TranslationBundle;
  owner?: SecretsOwner;
}): JSX.Element {
  const { trans } = props;
  const owner = props.owner ?? 'user';
  const ofOrganization = owner === 'organization';
  const titleId = `jp-RemoteCompute-${owner}-secrets-title`;
  const Heading = ofOrganization ? 'h4' : 'h3';
  const [data, setData] = React.useState<ISecrets | null>(null);
  const [error, setError] = React.useState<string | null>(null);
  const [editing, setEditing] = React.useState<string | null>(null); // '' = adding
  const [notice, setNotice] = React.useState<string | null>(null);

  const load = React.useCallback(async (): Promise<void> => {
    try {
      setData(await getSecrets(owner));
      setError(null);
    } catch (e) {
      setError(asAPIError(e).message);
    }
  }, [owner]);
  React.useEffect(() => {
    void load();
  }, [load]);

  const save = async (name: string, value: string): Promise<void> => {
    const stored = await setSecret(name, value, owner);
    setEditing(null);
    setNotice(trans.__('Saved %1 in %2.', stored.name, stored.where));
    await load();
  };

  const remove = async (name: string): Promise<void> => {
    setNotice(null);
    const answer = await showDialog({
      title: trans.__('Delete secret %1?', name),
      body: ofOrganization
        ? trans.__(
            "The organization's machines can no longer use it. A machine that names it keeps it from being deleted."
          )
        : trans.__(
            'Jobs and machines that name it can no longer use it. A machine or an unfinished job that uses it now keeps it from being deleted.'
          ),
      buttons: [
        Dialog.cancelButton({ label: trans.__('Cancel') }),
        Dialog.warnButton({ label: trans.__('Delete') })
      ]
    });
    if (!answer.button.accept) {
      return;
    }
    try {
      await deleteSecret(name, owner);
    } catch (e) {
      // Refused (in use) or failed: nothing changed, so no reload, which would clear this message.
      setError(asAPIError(e).message);
      return;
    }
    setNotice(trans.__('Deleted %1.', name));
    setError(null);
    await load();
  };

  const store = data?.store;
  return (
    <section
      className={
        ofOrganization
          ? 'jp-RemoteCompute-secrets'
          : 'jp-RemoteCompute-section jp-RemoteCompute-secrets'
      }
      aria-labelledby={titleId}
    >
      <div className="jp-RemoteCompute-sectionHeader">
        <Heading
          id={titleId}
          className={
            ofOrganization
              ? 'jp-RemoteCompute-subsectionTitle'
              : 'jp-RemoteCompute-sectionTitle'
          }
        >
          {ofOrganization
            ? trans.__("The organization's secrets")
            : trans.__('Secrets')}
        </Heading>
        <ToolbarButtonComponent
          icon={addIcon}
          tooltip={
            store
              ? trans.__('Add a secret (it goes to %1)', store.where)
              : trans.__('Add a secret')
          }
          enabled={store?.usable !== false}
          onClick={() => {
            setNotice(null);
            setEditing('');
          }}
        />
        <ToolbarButtonComponent
          icon={refreshIcon}
          tooltip={
            ofOrganization
              ? trans.__("Refresh the organization's secrets")
              : trans.__('Refresh secrets')
          }
          onClick={() => void load()}
        />
      </div>
      {store?.usable && store.note && (
        <p
          className="jp-RemoteCompute-secretWarning"
          role="note"
          title={store.note}
        >
          {trans.__('Not encrypted: %1.', store.where)}
        </p>
      )}
      {store && !store.usable && store.problem && (
        <StoreProblem problem={store.problem} trans={trans} />
      )}
      {error && (
        <div className="jp-RemoteCompute-banner" role="alert">
          {error}
        </div>
      )}
      {notice && (
        <div className="jp-RemoteCompute-fieldHelp" role="status">
          {notice}
        </div>
      )}
      {editing === '' && (
        <SecretEditor
          trans={trans}
          owner={owner}
          onSave={save}
          onCancel={() => setEditing(null)}
        />
      )}
      {data && data.secrets.length === 0 && (
        <p className="jp-RemoteCompute-empty">{trans.__('No secrets yet.')}</p>
      )}
      <ul className="jp-RemoteCompute-secretList">
        {data?.secrets.map(secret => (
          <li
            key={`${secret.source}:${secret.name}`}
            className="jp-RemoteCompute-secret"
            data-name={secret.name}
          >
            <span className="jp-RemoteCompute-itemName">{secret.name}</span>
            <span
              className="jp-RemoteCompute-secretBadge"
              data-source={secret.source}
              title={secret.where}
            >
              {placeBadge(secret, trans)}
            </span>
            {secret.problem && (
              <span
                className="jp-RemoteCompute-secretProblem"
                title={secret.problem}
                role="note"
              >
                {trans.__('not used')}
              </span>
            )}
            {!secret.read_only && (
              <>
                <ToolbarButtonComponent
                  icon={editIcon}
                  tooltip={trans.__('Replace %1', secret.name)}
                  onClick={() => {
                    setNotice(null);
                    setEditing(secret.name);
                  }}
                />
                <ToolbarButtonComponent
                  icon={deleteIcon}
                  tooltip={trans.__('Delete %1', secret.name)}
                  onClick={() => void remove(secret.name)}
                />
              </>
            )}
            {editing === secret.name && (
              <SecretEditor
                trans={trans}
                owner={owner}
                name={secret.name}
                onSave={save}
                onCancel={() => setEditing(null)}
              />
            )}
          </li>
        ))}
      </ul>
    </section>
  );
}

/**
 * Why secrets cannot be kept here, in a sidebar's width: one line says so, and the store's own
 * explanation (which keyrings were tried, what to install or set) opens on request.
 */
function StoreProblem(props: {
  problem: string;
  trans: TranslationBundle;
}): JSX.Element {
  const { problem, trans } = props;
  return (
    <div
      className="jp-RemoteCompute-banner jp-RemoteCompute-storeProblem"
      role="alert"
    >
      <details>
        <summary>{trans.__('Secrets cannot be stored here')}</summary>
        <p>{problem}</p>
      </details>
    </div>
  );
}
