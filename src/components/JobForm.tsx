/**
 * The "New Job" form, in the main area, drawn from the JSON Schema the server reads a job request
 * with (`GET /schemas/JobRequest`) in JupyterLab's own form component, as the pipeline step's
 * settings are (`forms/uiSchema.tsx`): machine, command, files to send and to bring back, name,
 * time limit, resources, the Python environment and image, and environment variables typed or
 * picked from the stored secrets; and a Sweep section (SweepSection.tsx) that runs it once per
 * combination of parameters. "Run Again" and the file browser's "Run on a Machine…" open it
 * filled in; "New Job" opens it empty.
 *
 * Settings are checked by the server only, so the form shows the server's own message beside the
 * field it names (`resources.cpus`, `env.TOKEN`): the same words as the CLI and the API.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { Button, ReactWidget, runIcon } from '@jupyterlab/ui-components';
import { ReadonlyJSONObject } from '@lumino/coreutils';
import { CommandRegistry } from '@lumino/commands';
import { RJSFSchema } from '@rjsf/utils';
import * as React from 'react';

import {
  getFormSchema,
  getSecrets,
  IJob,
  IJobSpec,
  startSweep,
  submitJob
} from '../api';
import { PickFiles } from '../filePicker';
import {
  formSchema,
  fromFormData,
  IFormSchema,
  toFormData
} from '../forms/formSchema';
import {
  fieldErrors,
  PlacedProblem,
  problemPath,
  SchemaForm,
  settingsUiSchema,
  stillStanding
} from '../forms/uiSchema';
import { asAPIError, ComputeModel } from '../model';
import { useSignal } from './common';
import { jobMachine, jobUiSchema, SHOWN } from './jobFormUi';
import { NO_SWEEP, SweepSection, sweepRequest } from './SweepSection';

type Data = Record<string, unknown>;

let schemaOnce: Promise<IFormSchema> | null = null;

/**
 * The request's schema, asked once a page; only the settings the form offers (`SHOWN`).
 */
function jobSchema(): Promise<IFormSchema> {
  schemaOnce ??= getFormSchema('JobRequest').then(
    raw => {
      // The type's own title and help are the API's: the form has its heading.
      const properties = (raw.properties ?? {}) as Data;
      return formSchema({
        ...raw,
        title: undefined,
        description: undefined,
        properties: Object.fromEntries(
          SHOWN.filter(k => k in properties).map(k => [k, properties[k]])
        )
      });
    },
    error => {
      schemaOnce = null;
      throw error;
    }
  );
  return schemaOnce;
}

/**
 * A spec's paths as a list: one path may be given as a string.
 */
function pathList(paths: string | string[] | null | undefined): string[] {
  return typeof paths === 'string' ? [paths] : (paths ?? []);
}

/**
 * What a job's settings say, without what says nothing (an empty text, list or group, the
 * runtime's `auto`): the server reads the rest, and the idempotency key of a job repeated stays
 * its original's.
 */
function pruned(value: unknown): unknown {
  if (Array.isArray(value)) {
    return value.length ? value : undefined;
  }
  if (typeof value === 'object' && value !== null) {
    const out: Data = {};
    for (const [key, inner] of Object.entries(value)) {
      const kept = pruned(inner);
      if (kept !== undefined && kept !== false) {
        out[key] = kept;
      }
    }
    return Object.keys(out).length ? out : undefined;
  }
  return value === '' || value === null ? undefined : value;
}

function specOf(data: Data, before: Data, form: IFormSchema): IJobSpec {
  const read = fromFormData(data, before, form);
  const environment = read.environment as Data | undefined;
  if (environment?.runtime === 'auto' || !environment?.image) {
    delete environment?.runtime;
  }
  // A time limit typed as seconds is a number; 30m, 2h stay text.
  const timeout = typeof read.timeout === 'string' ? read.timeout.trim() : '';
  if (timeout && Number.isFinite(Number(timeout))) {
    read.timeout = Number(timeout);
  }
  return (pruned(read) ?? {}) as IJobSpec;
}

function JobForm(props: {
  model: ComputeModel;
  trans: TranslationBundle;
  commands: CommandRegistry;
  spec?: IJobSpec;
  pickFiles?: PickFiles | null;
  onStarted: () => void;
}): JSX.Element {
  const { model, trans, commands, pickFiles } = props;
  useSignal(model.changed);
  const [form, setForm] = React.useState<IFormSchema | null>(null);
  const [loadError, setLoadError] = React.useState<string | null>(null);
  React.useEffect(() => {
    jobSchema().then(setForm, error => setLoadError(asAPIError(error).message));
  }, []);
  const [secretNames, setSecretNames] = React.useState<string[]>([]);
  React.useEffect(() => {
    // Names only: the listing never holds a value.
    getSecrets().then(
      data =>
        setSecretNames(data.secrets.filter(s => !s.problem).map(s => s.name)),
      () => setSecretNames([])
    );
  }, []);

  // The environment of the job this one repeats: kept (never shown), under the rows typed here.
  const keptEnv = props.spec?.env ?? {};
  const before = React.useMemo((): Data => {
    const spec = props.spec;
    return {
      ...spec,
      machine: spec?.machine ?? model.defaultMachine ?? 'local',
      send: pathList(spec?.send),
      bring_back: pathList(spec?.bring_back),
      env: {}
    };
  }, []);
  const [data, setData] = React.useState<Data | null>(null);
  React.useEffect(() => {
    if (form && data === null) {
      setData(toFormData(before, form));
    }
  }, [form]);

  const [problems, setProblems] = React.useState<PlacedProblem[]>([]);
  const [formError, setFormError] = React.useState<string | null>(null);
  const [busy, setBusy] = React.useState(false);
  const [submitted, setSubmitted] = React.useState<{
    job: IJob;
    attached: boolean;
  } | null>(null);
  const [sweep, setSweep] = React.useState(NO_SWEEP);
  const [sweepError, setSweepError] = React.useState<string | null>(null);
  const [sweepStarted, setSweepStarted] = React.useState<string | null>(null);

  const schema = form?.schema ?? null;
  const environment = (data?.environment ?? {}) as Data;
  const hasImage = !!String(environment.image ?? '').trim();
  const uiSchema = React.useMemo(
    () => settingsUiSchema(schema, jobUiSchema(trans, hasImage)),
    [schema, hasImage]
  );
  const machines = model.machines.filter(
    m => m.enabled || jobMachine(m) === data?.machine
  );
  const formContext = React.useMemo(
    () => ({
      trans,
      pickFiles: pickFiles ?? null,
      secretNames,
      machines,
      pools: model.pools,
      defaultMachine: model.defaultMachine
    }),
    [trans, pickFiles, secretNames, machines, model.pools, model.defaultMachine]
  );
  const extraErrors = React.useMemo(
    () => (schema ? fieldErrors(problems, schema) : undefined),
    [problems, schema]
  );

  const submit = async (): Promise<void> => {
    if (!form || !data) {
      return;
    }
    const spec = specOf(data, before, form);
    if (Object.keys(keptEnv).length || spec.env) {
      spec.env = { ...keptEnv, ...spec.env };
    }
    setBusy(true);
    setFormError(null);
    setProblems([]);
    setSubmitted(null);
    setSweepError(null);
    setSweepStarted(null);
    const swept = sweepRequest(sweep);
    try {
      if (swept) {
        // Each trial is this job with its values put in: the server drives them (the panel's runs).
        const started = await startSweep({ ...swept, job: spec });
        setSweepStarted(
          trans.__(
            'Started sweep %1: %2 trials. Its trials are in the Compute panel, under Pipeline runs.',
            started.run.sweep?.name ?? started.run.id,
            Object.keys(started.run.nodes).length
          )
        );
        props.onStarted();
        void commands.execute('remote-compute:open');
        return;
      }
      const result = await submitJob(spec);
      model.upsertJob(result.job);
      setSubmitted(result);
      props.onStarted();
      void commands.execute('remote-compute:show-job', { id: result.job.id });
    } catch (error) {
      const apiError = asAPIError(error);
      // A job setting a sweep names as job.<field> is the form's own field.
      const field = apiError.field?.replace(/^job\./, '') ?? apiError.field;
      const path = problemPath(field, form.schema);
      if (swept && !apiError.field?.startsWith('job.') && apiError.field) {
        setSweepError(apiError.message);
      } else if (path.length) {
        // An Error's message is its own but not enumerable: named, not spread.
        setProblems([{ field, message: apiError.message, path }]);
      } else {
        setFormError(apiError.message);
      }
    } finally {
      setBusy(false);
    }
  };

  return (
    <div
      className="jp-RemoteCompute-form jp-RemoteCompute-schemaForm"
      role="form"
      aria-label={trans.__('New Job')}
    >
      <h2 className="jp-RemoteCompute-formTitle">{trans.__('New Job')}</h2>
      {(formError || loadError) && (
        <div className="jp-RemoteCompute-banner" role="alert">
          {formError || loadError}
        </div>
      )}
      {schema && data && (
        <SchemaForm
          idPrefix="jp-RemoteCompute-job"
          schema={schema as RJSFSchema}
          formData={data as ReadonlyJSONObject}
          extraErrors={extraErrors}
          uiSchema={uiSchema}
          formContext={formContext}
          onChange={event => {
            const next = (event.formData ?? {}) as Data;
            setProblems(ps => stillStanding(ps, data, next));
            setData(next);
          }}
          onSubmit={() => void submit()}
        />
      )}
      <SweepSection
        settings={sweep}
        onChange={setSweep}
        error={sweepError}
        trans={trans}
      />
      {Object.keys(keptEnv).length > 0 && (
        <p className="jp-RemoteCompute-fieldHelp">
          {trans.__(
            'Environment kept from the original job: %1',
            Object.keys(keptEnv).join(', ')
          )}
        </p>
      )}
      <div className="jp-RemoteCompute-formButtons">
        <button
          type="button"
          className="jp-mod-styled jp-mod-accept"
          disabled={busy || !data}
          onClick={() => void submit()}
        >
          {sweepRequest(sweep) ? trans.__('Run sweep') : trans.__('Run')}
        </button>
        {busy && (
          <span className="jp-RemoteCompute-busy">
            {trans.__('Submitting…')}
          </span>
        )}
      </div>
      {sweepStarted && (
        <div className="jp-RemoteCompute-submitted" role="status">
          {sweepStarted}
        </div>
      )}
      {submitted && (
        <div className="jp-RemoteCompute-submitted" role="status">
          <span>
            {submitted.attached
              ? trans.__(
                  'Attached to running job %1: the same work is already under way, nothing new was started.',
                  submitted.job.name || submitted.job.id
                )
              : trans.__(
                  'Started job %1.',
                  submitted.job.name || submitted.job.id
                )}
          </span>
          <Button
            type="button"
            minimal
            onClick={() =>
              void commands.execute('remote-compute:show-job', {
                id: submitted.job.id
              })
            }
          >
            {trans.__('Show Job')}
          </Button>
        </div>
      )}
    </div>
  );
}

export class JobFormWidget extends ReactWidget {
  constructor(options: JobFormWidget.IOptions) {
    super();
    this._options = options;
    this.addClass('jp-RemoteCompute-formWidget');
    this.title.label = options.trans.__('New Job');
    this.title.icon = runIcon;
    this.title.closable = true;
  }

  /**
   * Whether a job was started from this form: "New Job" then opens a fresh one.
   */
  get started(): boolean {
    return this._started;
  }

  render(): JSX.Element {
    const { model, trans, commands, spec, pickFiles } = this._options;
    return (
      <JobForm
        model={model}
        trans={trans}
        commands={commands}
        spec={spec}
        pickFiles={pickFiles}
        onStarted={() => {
          this._started = true;
        }}
      />
    );
  }

  private _options: JobFormWidget.IOptions;
  private _started = false;
}

export namespace JobFormWidget {
  export interface IOptions {
    model: ComputeModel;
    trans: TranslationBundle;
    commands: CommandRegistry;
    /**
     * The settings it opens with ("Run Again", "Run on a Machine…"); none: an empty form.
     */
    spec?: IJobSpec;
    /**
     * Picks workspace files (the files to send, the requirements file); none without a file
     * browser.
     */
    pickFiles?: PickFiles | null;
  }
}
