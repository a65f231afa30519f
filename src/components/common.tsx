/**
 * Pieces shared by the panel, the forms and the job detail.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { jupyterIcon, LabIcon, terminalIcon } from '@jupyterlab/ui-components';
import { ISignal } from '@lumino/signaling';
import * as React from 'react';

import { IJob, isActive } from '../api';
import { clock } from '../clock';
import { jobDuration, parseServerTime, relativeTime } from '../format';
import { computeIcon } from '../icons';

/**
 * Re-render whenever a signal fires.
 */
export function useSignal<T>(signal: ISignal<T, unknown>): void {
  const [, setVersion] = React.useState(0);
  React.useEffect(() => {
    const onChange = (): void => setVersion(v => v + 1);
    signal.connect(onChange);
    return () => {
      signal.disconnect(onChange);
    };
  }, [signal]);
}

/**
 * What `read` makes of the shared clock's time, read again on every tick; the component renders
 * again only when that changes (a text, a duration), so a list of times costs a call a second.
 */
export function useClock<T extends string | number | boolean>(
  read: (now: number) => T
): T {
  return React.useSyncExternalStore(clock.subscribe, () => read(clock.now));
}

/**
 * A past time as "3 min ago" that follows the shared clock, its exact time (ISO 8601) as the
 * element's `dateTime` and tooltip. `format` puts the relative text in a sentence ("added %1").
 */
export function RelativeTime(props: {
  when: string | number | null | undefined;
  trans: TranslationBundle;
  format?: (ago: string) => string;
  /**
   * The tooltip, when it should say more than the exact time.
   */
  title?: string;
}): JSX.Element | null {
  const { when, trans, format } = props;
  const ago = useClock(now => relativeTime(when, trans, now));
  const then = parseServerTime(when);
  if (when === null || when === undefined || when === '') {
    return null;
  }
  const exact = Number.isNaN(then)
    ? String(when)
    : new Date(then).toISOString();
  return (
    <time dateTime={exact} title={props.title ?? exact}>
      {format ? format(ago) : ago}
    </time>
  );
}

/**
 * How long a job ran, or has run so far while it runs (it follows the shared clock).
 */
export function JobDuration(props: {
  job: Pick<IJob, 'started' | 'ended'>;
}): JSX.Element {
  const { started, ended } = props.job;
  return <>{useClock(now => jobDuration({ started, ended }, now))}</>;
}

/**
 * The icon of a kind of machine.
 */
export function kindIcon(kind: string): LabIcon {
  switch (kind) {
    case 'ssh':
      return terminalIcon;
    case 'jupyter':
      return jupyterIcon;
    default:
      return computeIcon;
  }
}

export function KindIcon(props: { kind: string; label: string }): JSX.Element {
  const Icon = kindIcon(props.kind);
  return (
    <span
      className="jp-RemoteCompute-kindIcon"
      role="img"
      aria-label={props.label}
      title={props.label}
    >
      <Icon.react tag="span" width="14px" height="14px" />
    </span>
  );
}

/**
 * The translated name of a job state.
 */
export function stateLabel(state: string, trans: TranslationBundle): string {
  switch (state) {
    case 'queued':
      return trans.__('queued');
    case 'sending':
      return trans.__('sending');
    case 'pending':
      return trans.__('pending');
    case 'running':
      return trans.__('running');
    case 'collecting':
      return trans.__('collecting');
    case 'succeeded':
      return trans.__('succeeded');
    case 'failed':
      return trans.__('failed');
    case 'cancelled':
      return trans.__('cancelled');
    case 'lost':
      return trans.__('lost');
    // A pipeline node's own states (its job's are the ones above).
    case 'waiting':
      return trans.__('waiting');
    case 'reused':
      return trans.__('reused');
    case 'not_run':
      return trans.__('not run');
    case 'stopped_early':
      return trans.__('stopped early');
    default:
      return state;
  }
}

export function StateBadge(props: {
  job: Pick<IJob, 'state' | 'reason'>;
  trans: TranslationBundle;
}): JSX.Element {
  const { job, trans } = props;
  return (
    <span
      className="jp-RemoteCompute-state"
      data-state={job.state}
      data-active={isActive(job.state) ? 'true' : 'false'}
      title={job.reason ?? undefined}
    >
      {stateLabel(job.state, trans)}
    </span>
  );
}

/**
 * A labelled form field with its help text and inline error.
 */
export function Field(props: {
  id: string;
  label: string;
  help?: React.ReactNode;
  error?: string;
  children: (aria: {
    id: string;
    'aria-invalid': boolean;
    'aria-describedby'?: string;
  }) => React.ReactNode;
}): JSX.Element {
  const { id, label, help, error } = props;
  const described = [help ? `${id}-help` : '', error ? `${id}-error` : '']
    .filter(Boolean)
    .join(' ');
  return (
    <div
      className="jp-RemoteCompute-field"
      data-invalid={error ? 'true' : 'false'}
    >
      <label htmlFor={id} className="jp-RemoteCompute-fieldLabel">
        {label}
      </label>
      {props.children({
        id,
        'aria-invalid': !!error,
        'aria-describedby': described || undefined
      })}
      {help && (
        <div id={`${id}-help`} className="jp-RemoteCompute-fieldHelp">
          {help}
        </div>
      )}
      {error && (
        <div
          id={`${id}-error`}
          className="jp-RemoteCompute-fieldError"
          role="alert"
        >
          {error}
        </div>
      )}
    </div>
  );
}
