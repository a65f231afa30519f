/**
 * Small formatting helpers shared by the panel's components.
 */
import { TranslationBundle } from '@jupyterlab/translation';

/**
 * "3 min ago", "in 2 h", "just now" — through the translation bundle.
 */
export function relativeTime(
  iso: string | null | undefined,
  trans: TranslationBundle,
  now: number = Date.now()
): string {
  if (!iso) {
    return '';
  }
  const then = Date.parse(iso);
  if (Number.isNaN(then)) {
    return iso;
  }
  const seconds = Math.round((now - then) / 1000);
  const abs = Math.abs(seconds);
  if (abs < 45) {
    return trans.__('just now');
  }
  const steps: [number, number, string][] = [
    [3600, 60, 'min'],
    [86400, 3600, 'h'],
    [86400 * 30, 86400, 'd'],
    [86400 * 365, 86400 * 30, 'mo'],
    [Infinity, 86400 * 365, 'y']
  ];
  const [, size, unit] = steps.find(([limit]) => abs < limit)!;
  const n = abs / size;
  const amount = Math.max(1, Math.round(n));
  return seconds >= 0
    ? trans.__('%1 %2 ago', amount, unit)
    : trans.__('in %1 %2', amount, unit);
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
 * How long a job ran (or has been running): from started (else created) to ended (else now).
 */
export function jobDuration(
  job: { started: string | null; created: string | null; ended: string | null },
  now: number = Date.now()
): string {
  const from = Date.parse(job.started ?? '');
  if (Number.isNaN(from)) {
    return '';
  }
  const to = job.ended ? Date.parse(job.ended) : now;
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
