/**
 * The server's event bus as the Compute panel follows it: one websocket to
 * `api/events/subscribe`, whose state the panel can see. While it is open the panel makes no
 * timed requests; while it is down the model's fallback poll runs, and the socket is tried
 * again after a growing delay.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { Event, ServerConnection } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

/**
 * What the model needs of an event source. JupyterLab's own event manager fits too (it does
 * not say whether its socket is open, so the fallback poll then always runs).
 */
export interface IJobEvents {
  readonly stream: ISignal<unknown, Event.Emission>;
  /**
   * Whether events arrive now; undefined when the source cannot tell.
   */
  readonly connected?: boolean;
  readonly connectionChanged?: ISignal<unknown, boolean>;
}

const RECONNECT_FIRST = 1000;
const RECONNECT_MAX = 30000;

export class EventSocket implements IJobEvents, IDisposable {
  constructor(options: EventSocket.IOptions = {}) {
    this._settings = options.serverSettings ?? ServerConnection.makeSettings();
    this._connect();
  }

  get stream(): ISignal<this, Event.Emission> {
    return this._stream;
  }

  get connected(): boolean {
    return this._connected;
  }

  get connectionChanged(): ISignal<this, boolean> {
    return this._connectionChanged;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    window.clearTimeout(this._timer);
    const socket = this._socket;
    this._socket = null;
    if (socket) {
      socket.onopen = socket.onclose = socket.onmessage = null;
      socket.close();
    }
    Signal.clearData(this);
  }

  private _connect(): void {
    if (this._isDisposed) {
      return;
    }
    const { appendToken, token, WebSocket, wsUrl } = this._settings;
    let url = URLExt.join(wsUrl, 'api/events/subscribe');
    if (appendToken && token !== '') {
      url += `?token=${encodeURIComponent(token)}`;
    }
    const socket = new WebSocket(url);
    this._socket = socket;
    socket.onopen = () => {
      this._delay = RECONNECT_FIRST;
      this._setConnected(true);
    };
    socket.onmessage = (message: MessageEvent) => {
      if (typeof message.data !== 'string' || !message.data) {
        return;
      }
      try {
        this._stream.emit(JSON.parse(message.data) as Event.Emission);
      } catch {
        // Not an emission: ignored, as JupyterLab's own event manager would fail on it.
      }
    };
    socket.onclose = () => {
      if (this._socket !== socket) {
        return;
      }
      this._socket = null;
      this._setConnected(false);
      this._timer = window.setTimeout(() => this._connect(), this._delay);
      this._delay = Math.min(RECONNECT_MAX, this._delay * 2);
    };
  }

  private _setConnected(value: boolean): void {
    if (this._connected !== value) {
      this._connected = value;
      this._connectionChanged.emit(value);
    }
  }

  private _connected = false;
  private _connectionChanged = new Signal<this, boolean>(this);
  private _delay = RECONNECT_FIRST;
  private _isDisposed = false;
  private _settings: ServerConnection.ISettings;
  private _socket: WebSocket | null = null;
  private _stream = new Signal<this, Event.Emission>(this);
  private _timer = 0;
}

export namespace EventSocket {
  export interface IOptions {
    serverSettings?: ServerConnection.ISettings;
  }
}
