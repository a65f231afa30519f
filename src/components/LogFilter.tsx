/**
 * The log's source filter: in a job of several processes, show every line, one node's or one
 * rank's. Drawn once the log has lines prefixed `[<node> rank R] `; hidden for a job of one.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { HTMLSelect, ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import * as React from 'react';

import { LogFilter, LogView } from '../logview';

const ALL = '';

function valueOf(filter: LogFilter): string {
  if (!filter) {
    return ALL;
  }
  return JSON.stringify(
    filter.rank === undefined ? [filter.node] : [filter.node, filter.rank]
  );
}

function filterOf(value: string): LogFilter {
  if (value === ALL) {
    return null;
  }
  const [node, rank] = JSON.parse(value) as [string, string?];
  return rank === undefined ? { node } : { node, rank };
}

export function LogSourceFilter(props: {
  log: LogView;
  trans: TranslationBundle;
}): JSX.Element | null {
  const { log, trans } = props;
  if (log.sources.length === 0) {
    return null;
  }
  const options = [{ value: ALL, label: trans.__('All nodes and ranks') }];
  for (const { node, ranks } of log.sources) {
    options.push({
      value: valueOf({ node }),
      label: trans.__('Node %1', node)
    });
    for (const rank of ranks) {
      options.push({
        value: valueOf({ node, rank }),
        label: trans.__('%1 rank %2', node, rank)
      });
    }
  }
  return (
    <div className="jp-RemoteCompute-logFilter">
      <HTMLSelect
        aria-label={trans.__('Show the lines of')}
        value={valueOf(log.filter)}
        options={options}
        onChange={event => {
          log.filter = filterOf(event.currentTarget.value);
        }}
      />
    </div>
  );
}

/**
 * The filter above a log, redrawn as new nodes and ranks appear in it.
 */
export class LogFilterWidget extends ReactWidget {
  constructor(
    private _log: LogView,
    private _trans: TranslationBundle
  ) {
    super();
    this.addClass('jp-RemoteCompute-logFilterWidget');
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this._log.sourcesChanged}>
        {() => <LogSourceFilter log={this._log} trans={this._trans} />}
      </UseSignal>
    );
  }
}
