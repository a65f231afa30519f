/**
 * A schema as its form draws it (a step's settings, a job request, a machine). A setting that takes one of several types
 * (`oneOf`/`anyOf`: a time limit as seconds or `2h`, memory as MiB or `32G`, a command as a line or
 * its words, each maybe none) is one text field: the server reads every such text as the schema
 * allows, so a person never picks a type. A `null` choice is the field left empty.
 */
import { RJSFSchema } from '@rjsf/utils';

import { shellLine } from '../format';

type Schema = Record<string, unknown>;

/**
 * The schema the form draws, and the settings (dotted paths, `resources.memory`) it shows as text:
 * each with whether the text is read as a number (a choice that has no text of its own).
 */
export interface IFormSchema {
  schema: RJSFSchema;
  textPaths: ReadonlyMap<string, 'text' | 'number'>;
}

function variantsOf(schema: Schema): Schema[] | null {
  const variants = schema.oneOf ?? schema.anyOf;
  return Array.isArray(variants) ? (variants as Schema[]) : null;
}

function isStringList(schema: Schema): boolean {
  return schema.type === 'array' && (schema.items as Schema)?.type === 'string';
}

const OWN_KEYS = ['title', 'description', 'default', 'examples'];

/**
 * A choice the form needs no field for: one type or none (a group of settings, a list left
 * empty) is that type; a file or a list of files whose default is a list is the list. The
 * setting's own title, help and default are kept.
 */
function withoutChoice(schema: Schema): Schema {
  const variants = variantsOf(schema);
  if (!variants) {
    return schema;
  }
  const kept = variants.filter(v => v.type !== 'null');
  const list = kept.find(isStringList);
  const one =
    kept.length === 1 &&
    (kept[0].type === 'object' || kept[0].type === 'array' || '$ref' in kept[0])
      ? kept[0]
      : list && Array.isArray(schema.default)
        ? list
        : null;
  if (!one) {
    return schema;
  }
  const out: Schema = { ...one };
  for (const key of OWN_KEYS) {
    if (key in schema && schema[key] !== null) {
      out[key] = schema[key];
    }
  }
  return out;
}

/**
 * The schema with its `$defs` written in place (the types a pydantic model uses: none refers to
 * itself) and no choice the form needs no field for; the server keeps reading the schema as
 * written.
 */
function inlined(schema: Schema, defs: Record<string, Schema>): Schema {
  let out = withoutChoice(schema);
  const ref = out.$ref;
  if (typeof ref === 'string' && ref.startsWith('#/$defs/')) {
    const own = { ...out };
    delete own.$ref;
    out = {
      ...inlined(defs[ref.slice('#/$defs/'.length)] ?? {}, defs),
      ...own
    };
  }
  const properties = out.properties as Record<string, Schema> | undefined;
  if (properties) {
    out = {
      ...out,
      properties: Object.fromEntries(
        Object.entries(properties).map(([k, v]) => [k, inlined(v, defs)])
      )
    };
  }
  if (Array.isArray(out.enum) && out.enum.includes(null)) {
    // A choice of names or none: none is the field left at its default.
    out = { ...out, enum: out.enum.filter(v => v !== null) };
    delete out.nullable;
  }
  return out;
}

/**
 * One text field for a choice of scalars (and of a line and its words); null when the choice is
 * of another shape, which the form then draws as rjsf does.
 */
function asText(schema: Schema): Schema | null {
  const variants = variantsOf(schema);
  if (!variants) {
    return null;
  }
  const kept = variants.filter(v => v.type !== 'null');
  const textual = kept.every(
    v =>
      ['string', 'number', 'integer'].includes(String(v.type)) ||
      isStringList(v)
  );
  if (kept.length === 0 || !textual) {
    return null;
  }
  const text: Schema = { type: 'string' };
  for (const key of OWN_KEYS) {
    if (key in schema) {
      text[key] = schema[key];
    }
  }
  if (Array.isArray(text.examples)) {
    text.examples = (text.examples as unknown[]).map(e => toText(e));
  }
  if (text.default !== undefined) {
    text.default = toText(text.default);
  }
  return text;
}

function toText(value: unknown): string {
  if (Array.isArray(value)) {
    return shellLine(value.map(String));
  }
  return value === null || value === undefined ? '' : String(value);
}

function walk(
  schema: Schema,
  path: string,
  textPaths: Map<string, 'text' | 'number'>
): Schema {
  const out: Schema = { ...schema };
  const properties = schema.properties as Record<string, Schema> | undefined;
  if (properties) {
    out.properties = Object.fromEntries(
      Object.entries(properties).map(([key, prop]) => {
        const at = path ? `${path}.${key}` : key;
        const text = asText(prop);
        if (text) {
          const numeric = !variantsOf(prop)!.some(
            v => v.type === 'string' || v.type === 'array'
          );
          textPaths.set(at, numeric ? 'number' : 'text');
          return [key, text];
        }
        return [key, walk(prop, at, textPaths)];
      })
    );
  }
  return out;
}

/**
 * The form's schema of a step's settings. rjsf's validator (draft 07) has no meta-schema for
 * 2020-12, and needs none (the server validates against the schema as written).
 */
export function formSchema(settings: Schema): IFormSchema {
  const textPaths = new Map<string, 'text' | 'number'>();
  const defs = (settings.$defs ?? {}) as Record<string, Schema>;
  const schema = walk(inlined(settings, defs), '', textPaths);
  delete schema.$schema;
  delete schema.$defs;
  return { schema: schema as RJSFSchema, textPaths };
}

function mapAt(
  data: Record<string, unknown>,
  paths: ReadonlyMap<string, unknown>,
  prefix: string,
  f: (path: string, value: unknown) => unknown
): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(data)) {
    const at = prefix ? `${prefix}.${key}` : key;
    if (paths.has(at)) {
      out[key] = f(at, value);
    } else if (
      typeof value === 'object' &&
      value !== null &&
      !Array.isArray(value) &&
      [...paths.keys()].some(p => p.startsWith(`${at}.`))
    ) {
      out[key] = mapAt(value as Record<string, unknown>, paths, at, f);
    } else {
      out[key] = value;
    }
  }
  return out;
}

function valueAt(data: Record<string, unknown>, path: string): unknown {
  return path
    .split('.')
    .reduce<unknown>(
      (at, key) =>
        typeof at === 'object' && at !== null
          ? (at as Record<string, unknown>)[key]
          : undefined,
      data
    );
}

/**
 * The node's settings as the form shows them: the text settings as text.
 */
export function toFormData(
  settings: Record<string, unknown>,
  form: IFormSchema
): Record<string, unknown> {
  return mapAt(settings, form.textPaths, '', (_, value) =>
    value === null ? undefined : toText(value)
  );
}

/**
 * The settings from the form's data: a text setting that reads as before keeps its value as the
 * file had it (seconds stay a number, a command's words stay a list), so opening a form changes
 * nothing; an edited one is the text, which the server reads.
 */
export function fromFormData(
  data: Record<string, unknown>,
  before: Record<string, unknown>,
  form: IFormSchema
): Record<string, unknown> {
  return mapAt(data, form.textPaths, '', (path, value) => {
    const previous = valueAt(before, path);
    if (previous !== undefined && toText(previous) === value) {
      return previous;
    }
    const number = Number(value);
    return form.textPaths.get(path) === 'number' &&
      typeof value === 'string' &&
      value.trim() !== '' &&
      !Number.isNaN(number)
      ? number
      : value;
  });
}
