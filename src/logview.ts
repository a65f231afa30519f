/**
 * A live log view that stays smooth with megabytes of output.
 *
 * Text is appended as it arrives; ANSI escapes are stripped and carriage-return progress
 * lines collapse to their last state. At most `maxLines` lines are kept (older ones are
 * dropped and counted), and only the lines in view are in the DOM: the scroller holds a
 * spacer as tall as every line, and one <pre> with the visible slice is moved over it.
 * It follows new lines until the person scrolls up (a wheel, a key, a drag of the scrollbar),
 * and again once they scroll back to the end; a change of layout never stops it.
 *
 * A job of several processes prefixes each line with where it came from, `[<node> rank R] `
 * (its launcher's own lines `[<node>] `): the view gathers the nodes and ranks it has seen
 * (`sources`) and may show only one node's lines or one rank's (`filter`).
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { Message } from '@lumino/messaging';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { stripAnsi } from './format';

const OVERSCAN = 20;
/**
 * What a person does to scroll; a scroll within `USER_SCROLL_MS` after one of these is theirs.
 */
const USER_SCROLL_EVENTS = ['wheel', 'keydown', 'pointerdown', 'touchmove'];
const USER_SCROLL_MS = 1000;
const FALLBACK_LINE_HEIGHT = 17;
/**
 * A line's source: `[node3 rank 5] ` or `[node3] `.
 */
const SOURCE = /^\[([^\]\s]+)(?: rank (\d+))?\] /;

/**
 * One node of a job of several and the ranks seen on it (in the order of their numbers).
 */
export interface ILogNode {
  node: string;
  ranks: string[];
}

/**
 * Which lines a log shows: every line (null), one node's (its ranks' and its launcher's), or
 * one rank's.
 */
export type LogFilter = { node: string; rank?: string } | null;

/**
 * Whether `line` came from where `filter` says.
 */
export function fromSource(line: string, filter: LogFilter): boolean {
  if (!filter) {
    return true;
  }
  const m = SOURCE.exec(line);
  if (!m || m[1] !== filter.node) {
    return false;
  }
  return filter.rank === undefined || m[2] === filter.rank;
}

export class LogView extends Widget {
  constructor(options: LogView.IOptions) {
    super();
    this._trans = options.trans;
    this._maxLines = options.maxLines;
    this.addClass('jp-RemoteCompute-logView');

    this._status = document.createElement('div');
    this._status.className = 'jp-RemoteCompute-logStatus';
    this._status.setAttribute('aria-live', 'polite');

    this._scroller = document.createElement('div');
    this._scroller.className = 'jp-RemoteCompute-logScroller';
    this._scroller.setAttribute('role', 'log');
    this._scroller.setAttribute('aria-label', options.label);
    this._scroller.tabIndex = 0;

    this._spacer = document.createElement('div');
    this._spacer.className = 'jp-RemoteCompute-logSpacer';
    this._pre = document.createElement('pre');
    this._pre.className = 'jp-RemoteCompute-logText';
    this._scroller.appendChild(this._spacer);
    this._scroller.appendChild(this._pre);

    this.node.appendChild(this._status);
    this.node.appendChild(this._scroller);
    this._scroller.addEventListener('scroll', this, { passive: true });
    for (const type of USER_SCROLL_EVENTS) {
      this._scroller.addEventListener(type, this, { passive: true });
    }
    this._renderStatus();
  }

  /**
   * Lines kept (the partial last line included).
   */
  get lineCount(): number {
    return this._lines.length + (this._partial ? 1 : 0);
  }

  /**
   * Lines dropped from the top to keep at most `maxLines`.
   */
  get dropped(): number {
    return this._dropped;
  }

  /**
   * The kept text (for copying; not what is rendered).
   */
  get text(): string {
    const tail = collapseCarriageReturns(this._partial);
    return this._lines.join('\n') + (tail ? '\n' + tail : '');
  }

  get maxLines(): number {
    return this._maxLines;
  }
  set maxLines(value: number) {
    this._maxLines = Math.max(1, value);
    this._trim();
    this._schedule();
  }

  /**
   * The nodes and ranks seen in the log's lines, in the order the nodes were first seen.
   */
  get sources(): ILogNode[] {
    return this._sources;
  }

  /**
   * Sources were seen for the first time, or the filter changed.
   */
  get sourcesChanged(): ISignal<this, void> {
    return this._sourcesChanged;
  }

  get filter(): LogFilter {
    return this._filter;
  }
  set filter(value: LogFilter) {
    this._filter = value;
    this._shown = value
      ? this._lines.filter(line => fromSource(line, value))
      : [];
    this._follow = true;
    this._sourcesChanged.emit();
    this._schedule();
  }

  /**
   * A note under the log's title ("waiting for output", "log complete", an error).
   */
  set note(value: string) {
    this._note = value;
    this._renderStatus();
  }

  append(chunk: string): void {
    if (!chunk) {
      return;
    }
    const text = stripAnsi(this._partial + chunk).replace(/\r\n/g, '\n');
    const parts = text.split('\n');
    // The unfinished last line stays raw: a later \r or escape may still change it.
    this._partial = parts.pop() ?? '';
    let seen = false;
    for (const part of parts) {
      const line = collapseCarriageReturns(part);
      this._lines.push(line);
      seen = this._see(line) || seen;
      if (this._filter && fromSource(line, this._filter)) {
        this._shown.push(line);
      }
    }
    this._trim();
    if (seen) {
      this._sourcesChanged.emit();
    }
    this._schedule();
  }

  clear(): void {
    this._lines = [];
    this._shown = [];
    this._partial = '';
    this._dropped = 0;
    this._schedule();
  }

  /**
   * Whether the view keeps to the end as lines arrive.
   */
  get following(): boolean {
    return this._follow;
  }

  handleEvent(event: Event): void {
    if (event.type !== 'scroll') {
      this._userInput = performance.now();
      return;
    }
    const el = this._scroller;
    const atEnd =
      el.scrollTop + el.clientHeight >= el.scrollHeight - this._lineHeight;
    // Our own scroll to the end, a resize or new content are not a person leaving the end.
    const byUser = performance.now() - this._userInput < USER_SCROLL_MS;
    if (atEnd) {
      this._follow = true;
    } else if (byUser) {
      this._follow = false;
    }
    this._schedule();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    if (this._frame) {
      cancelAnimationFrame(this._frame);
    }
    this._scroller.removeEventListener('scroll', this);
    for (const type of USER_SCROLL_EVENTS) {
      this._scroller.removeEventListener(type, this);
    }
    super.dispose();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._measure();
    this._schedule();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._schedule();
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this._schedule();
  }

  private _trim(): void {
    const excess = this.lineCount - this._maxLines;
    if (excess > 0) {
      const n = Math.min(excess, this._lines.length);
      const gone = this._lines.splice(0, n);
      this._dropped += n;
      if (this._filter) {
        const filter = this._filter;
        this._shown.splice(
          0,
          gone.filter(line => fromSource(line, filter)).length
        );
      }
    }
  }

  /**
   * Note where `line` came from; true when that node or rank is new.
   */
  private _see(line: string): boolean {
    const m = SOURCE.exec(line);
    if (!m) {
      return false;
    }
    const [, name, rank] = m;
    const known = this._sources.find(source => source.node === name);
    if (known && (!rank || known.ranks.includes(rank))) {
      return false;
    }
    const ranks = [...(known?.ranks ?? []), ...(rank ? [rank] : [])].sort(
      (a, b) => Number(a) - Number(b)
    );
    const node = { node: name, ranks };
    this._sources = known
      ? this._sources.map(source => (source === known ? node : source))
      : [...this._sources, node];
    return true;
  }

  private _measure(): void {
    // A block in the <pre> is exactly one line box tall (an inline span would give the
    // font's height instead, and rows would drift).
    const probe = document.createElement('div');
    probe.textContent = 'M';
    this._pre.appendChild(probe);
    const height = probe.getBoundingClientRect().height;
    probe.remove();
    if (height > 0) {
      this._lineHeight = height;
    }
  }

  private _schedule(): void {
    if (this._frame || this.isDisposed) {
      return;
    }
    this._frame = requestAnimationFrame(() => {
      this._frame = 0;
      this._render();
    });
  }

  private _render(): void {
    if (!this.isAttached) {
      return;
    }
    if (this._lineHeight === FALLBACK_LINE_HEIGHT) {
      this._measure();
    }
    const lh = this._lineHeight;
    const lines = this._filter ? this._shown : this._lines;
    const partial =
      this._partial && fromSource(this._partial, this._filter)
        ? collapseCarriageReturns(this._partial)
        : '';
    const total = lines.length + (partial ? 1 : 0);
    this._spacer.style.height = `${total * lh}px`;
    const el = this._scroller;
    if (this._follow) {
      el.scrollTop = el.scrollHeight;
    }
    const first = Math.max(0, Math.floor(el.scrollTop / lh) - OVERSCAN);
    const visible = Math.ceil(el.clientHeight / lh) + 2 * OVERSCAN;
    const last = Math.min(total, first + visible);
    const slice = lines.slice(first, Math.min(last, lines.length));
    if (partial && last >= total) {
      slice.push(partial);
    }
    this._pre.textContent = slice.join('\n');
    this._pre.style.transform = `translateY(${first * lh}px)`;
    this._renderStatus();
  }

  private _renderStatus(): void {
    const parts: string[] = [];
    if (this._note) {
      parts.push(this._note);
    }
    if (this._filter) {
      const { node, rank } = this._filter;
      parts.push(
        rank === undefined
          ? this._trans.__('%1 lines of node %2', this._shown.length, node)
          : this._trans.__(
              '%1 lines of %2 rank %3',
              this._shown.length,
              node,
              rank
            )
      );
    }
    if (this._dropped > 0) {
      parts.push(
        this._trans.__(
          '%1 earlier lines not shown (keeping the last %2)',
          this._dropped,
          this._maxLines
        )
      );
    }
    this._status.textContent = parts.join(' · ');
  }

  private _dropped = 0;
  private _filter: LogFilter = null;
  private _follow = true;
  private _frame = 0;
  private _lineHeight = FALLBACK_LINE_HEIGHT;
  private _lines: string[] = [];
  private _maxLines: number;
  private _note = '';
  private _partial = '';
  private _pre: HTMLPreElement;
  private _scroller: HTMLDivElement;
  private _shown: string[] = [];
  private _sources: ILogNode[] = [];
  private _sourcesChanged = new Signal<this, void>(this);
  private _spacer: HTMLDivElement;
  private _status: HTMLDivElement;
  private _trans: TranslationBundle;
  private _userInput = -Infinity;
}

/**
 * "10%\r50%\r100%" → "100%": what a terminal would show of a progress line.
 */
function collapseCarriageReturns(line: string): string {
  const i = line.lastIndexOf('\r');
  if (i < 0) {
    return line;
  }
  // A trailing \r (the line is about to be redrawn) keeps the text before it.
  if (i === line.length - 1) {
    return collapseCarriageReturns(line.slice(0, -1));
  }
  return line.slice(i + 1);
}

export namespace LogView {
  export interface IOptions {
    trans: TranslationBundle;
    maxLines: number;
    /**
     * The accessible name of the log region.
     */
    label: string;
  }
}
