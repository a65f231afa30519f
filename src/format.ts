/**
 * Small formatting helpers shared by the panel's components.
 */
import { TranslationBundle } from '@jupyterlab/translation';

// An ISO 8601 date and time: its fraction and offset apart, to read them exactly.
const ISO_TIME =
  /^(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2})?)(?:[.,](\d+))?(Z|[+-]\d{2}(?::?\d{2})?)?$/i;

/**
 * Milliseconds since the epoch of a time the server gave: an ISO 8601 string (the server writes
 * UTC, `2026-11-29T10:02:00.123Z`; one without an offset is read as UTC too, where `Date.parse`
 * would take it for the browser's local time; digits past the milliseconds are cut, as Python's
 * microseconds) or epoch seconds (a number). NaN when it is neither.
 */
export function parseServerTime(
  value: string | number | null | undefined
): number {
  if (typeof value === 'number') {
    return Number.isFinite(value) ? value * 1000 : NaN;
  }
  const match = ISO_TIME.exec((value ?? '').trim());
  if (!match) {
    return NaN;
  }
  const [, dateTime, fraction, offset] = match;
  const millis = fraction ? `.${fraction.slice(0, 3).padEnd(3, '0')}` : '';
  let zone = (offset ?? 'Z').toUpperCase();
  if (/^[+-]\d{2}$/.test(zone)) {
    zone += ':00';
  } else if (/^[+-]\d{4}$/.test(zone)) {
    zone = `${zone.slice(0, 3)}:${zone.slice(3)}`;
  }
  return Date.parse(`${dateTime.replace(' ', 'T')}${millis}${zone}`);
}

/**
 * How long ago something happened, through the translation bundle: "just now" under 45 s, then
 * the whole units passed ("2 min ago" from 2 min to 2 min 59 s, "3 h ago", "5 d ago"). Every time
 * shown this way is a past event's, so one ahead of `now` (the browser's clock behind the
 * server's) reads "just now", never "in …". `now` is the shared clock's (`clock.ts`).
 */
export function relativeTime(
  when: string | number | null | undefined,
  trans: TranslationBundle,
  now: number
): string {
  if (when === null || when === undefined || when === '') {
    return '';
  }
  const then = parseServerTime(when);
  if (Number.isNaN(then)) {
    return String(when);
  }
  const seconds = Math.floor((now - then) / 1000);
  if (seconds < 45) {
    return trans.__('just now');
  }
  const minutes = Math.max(1, Math.floor(seconds / 60));
  const hours = Math.floor(minutes / 60);
  const days = Math.floor(hours / 24);
  const months = Math.floor(days / 30);
  const years = Math.floor(days / 365);
  if (minutes < 60) {
    return trans._n('%1 min ago', '%1 min ago', minutes);
  }
  if (hours < 24) {
    return trans._n('%1 h ago', '%1 h ago', hours);
  }
  if (days < 30) {
    return trans._n('%1 d ago', '%1 d ago', days);
  }
  if (years < 1) {
    return trans._n('%1 mo ago', '%1 mo ago', months);
  }
  return trans._n('%1 y ago', '%1 y ago', years);
}

/**
 * "1h02m", "3m05s", "12s".
 */
export function formatDuration(ms: number): string {
  let seconds = Math.max(0, Math.floor(ms / 1000));
  const h = Math.floor(seconds / 3600);
  seconds -= h * 3600;
  const m = Math.floor(seconds / 60);
  const s = seconds - m * 60;
  const pad = (v: number): string => String(v).padStart(2, '0');
  if (h > 0) {
    return `${h}h${pad(m)}m`;
  }
  if (m > 0) {
    return `${m}m${pad(s)}s`;
  }
  return `${s}s`;
}

/**
 * How long a job ran (or has been running): from started to ended (else `now`, the shared
 * clock's); empty before it started.
 */
export function jobDuration(
  job: { started: string | null; ended: string | null },
  now: number
): string {
  const from = parseServerTime(job.started);
  if (Number.isNaN(from)) {
    return '';
  }
  const to = job.ended ? parseServerTime(job.ended) : now;
  return formatDuration((Number.isNaN(to) ? now : to) - from);
}

/**
 * "1.5 MB", "320 B".
 */
export function formatSize(bytes: number | undefined | null): string {
  if (typeof bytes !== 'number' || !Number.isFinite(bytes)) {
    return '';
  }
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let value = bytes;
  let i = 0;
  while (value >= 1024 && i < units.length - 1) {
    value /= 1024;
    i++;
  }
  return i === 0
    ? `${value} B`
    : `${value.toFixed(value < 10 ? 1 : 0)} ${units[i]}`;
}

// CSI sequences (colours, cursor moves), OSC sequences (titles, links) and lone escapes.
const ANSI =
  // eslint-disable-next-line no-control-regex
  /\u001b\[[0-?]*[ -/]*[@-~]|\u001b\][^\u0007\u001b]*(?:\u0007|\u001b\\)|\u001b[@-Z\\-_]/g;

/**
 * Remove ANSI escape sequences from a log chunk.
 */
export function stripAnsi(text: string): string {
  return text.replace(ANSI, '');
}

/**
 * Split free text into a list: one item per line or comma, blanks dropped.
 */
export function splitList(text: string): string[] {
  return text
    .split(/[\n,]/)
    .map(item => item.trim())
    .filter(item => item.length > 0);
}

/**
 * A job's command as the machine's shell runs it: a string as written, a list's words each quoted
 * as Python's `shlex.join` quotes them (the server's `command_line`).
 */
export function shellLine(command: string | readonly string[]): string {
  if (typeof command === 'string') {
    return command;
  }
  return command
    .map(word =>
      word === ''
        ? "''"
        : /^[\w@%+=:,./-]+$/.test(word)
          ? word
          : `'${word.replace(/'/g, "'\"'\"'")}'`
    )
    .join(' ');
}
