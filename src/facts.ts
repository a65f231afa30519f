/**
 * A machine's facts (what `check` reports) as one short line for people.
 */
import { formatSize } from './format';

/**
 * The facts every kind of machine reports (engines/base.py `Facts`), in the order shown.
 */
const COMMON_FACTS = [
  'os',
  'kernel',
  'python',
  'cpus',
  'memory_bytes',
  'gpus',
  'disk_free_bytes',
  'rtt_ms'
];

interface IGpuFact {
  name?: string;
  memory_bytes?: number | null;
}

function formatGpus(gpus: unknown): string {
  if (!Array.isArray(gpus) || gpus.length === 0) {
    return 'no GPU';
  }
  const counts = new Map<string, number>();
  for (const gpu of gpus as IGpuFact[]) {
    const label = gpu.memory_bytes
      ? `${gpu.name ?? 'GPU'} (${formatSize(gpu.memory_bytes)})`
      : (gpu.name ?? 'GPU');
    counts.set(label, (counts.get(label) ?? 0) + 1);
  }
  return [...counts.entries()]
    .map(([label, n]) => (n > 1 ? `${n}× ${label}` : label))
    .join(', ');
}

function formatFact(key: string, value: unknown): string {
  switch (key) {
    case 'os':
    case 'kernel':
      return String(value);
    case 'python':
      return `Python ${String(value)}`;
    case 'cpus':
      return `${String(value)} CPUs`;
    case 'memory_bytes':
      return `${formatSize(value as number)} memory`;
    case 'gpus':
      return formatGpus(value);
    case 'disk_free_bytes':
      return `${formatSize(value as number)} free disk`;
    case 'rtt_ms':
      return `${Math.round(value as number)} ms round trip`;
  }
  if (key.endsWith('_bytes') && typeof value === 'number') {
    return `${key.slice(0, -6).replace(/_/g, ' ')}: ${formatSize(value)}`;
  }
  const text =
    typeof value === 'object' ? JSON.stringify(value) : String(value);
  return `${key.replace(/_/g, ' ')}: ${text}`;
}

/**
 * A short, human line of a machine's facts (`Ubuntu 24.04 · Python 3.11.7 · 8 CPUs · no GPU · …`).
 *
 * Every common fact is shown for every kind (GPUs and free disk included), then what only
 * that kind reports (a server's version, its transfer route).
 */
export function formatFacts(facts: Record<string, unknown>): string {
  const present = (v: unknown): boolean =>
    v !== null &&
    v !== undefined &&
    v !== '' &&
    !(Array.isArray(v) && v.length === 0);
  const common = COMMON_FACTS.filter(
    k => k in facts && (k === 'gpus' || present(facts[k]))
  ).map(k => formatFact(k, facts[k]));
  const extras = Object.entries(facts)
    .filter(([k, v]) => !COMMON_FACTS.includes(k) && present(v))
    .map(([k, v]) => formatFact(k, v));
  return [...common, ...extras].join(' · ');
}
