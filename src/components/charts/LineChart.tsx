/**
 * A small line chart in plain SVG, coloured with JupyterLab's CSS variables so it follows the
 * theme: one series, x and y as numbers, a gap where y is missing (NaN, infinity).
 */
import * as React from 'react';

export interface ILinePoint {
  x: number;
  /**
   * null leaves a gap in the line.
   */
  y: number | null;
}

export interface ILineChartProps {
  /**
   * Shown above the chart and read by screen readers with the last value.
   */
  title: string;
  points: readonly ILinePoint[];
  xLabel: string;
  /**
   * Drawing size in SVG units; the chart scales to its container's width.
   */
  width?: number;
  height?: number;
  /**
   * Formats a value for the axis and the summary (default: up to 4 significant digits).
   */
  format?: (value: number) => string;
  /**
   * Points without a line (a metric against a parameter, several trials per value); the
   * `highlight`ed one larger.
   */
  dots?: boolean;
  highlight?: ILinePoint | null;
}

const PAD = { top: 8, right: 12, bottom: 22, left: 40 };
// What a character of a value label takes at the lab's smallest UI font, generously.
const LABEL_CHAR_WIDTH = 6.5;

export function formatNumber(value: number): string {
  if (value === 0) {
    return '0';
  }
  const abs = Math.abs(value);
  if (abs >= 1e5 || abs < 1e-3) {
    return value.toExponential(2);
  }
  return String(Number(value.toPrecision(4)));
}

/**
 * The extent of the values, widened a little when flat so a constant series is still a line.
 */
function extent(values: number[]): [number, number] {
  let low = Math.min(...values);
  let high = Math.max(...values);
  if (low === high) {
    const pad = low === 0 ? 1 : Math.abs(low) * 0.1;
    low -= pad;
    high += pad;
  }
  return [low, high];
}

/**
 * The SVG path of the points in order, moving (not drawing) across a gap.
 */
export function linePath(
  points: readonly ILinePoint[],
  sx: (x: number) => number,
  sy: (y: number) => number
): string {
  let path = '';
  let pen = false;
  for (const p of points) {
    if (p.y === null || !Number.isFinite(p.y)) {
      pen = false;
      continue;
    }
    path += `${pen ? 'L' : 'M'}${sx(p.x).toFixed(1)},${sy(p.y).toFixed(1)}`;
    pen = true;
  }
  return path;
}

export function LineChart(props: ILineChartProps): JSX.Element {
  const width = props.width ?? 320;
  const height = props.height ?? 140;
  const format = props.format ?? formatNumber;
  // Points sorted by x, so a metric logged out of order still reads left to right.
  const points = React.useMemo(
    () => [...props.points].sort((a, b) => a.x - b.x),
    [props.points]
  );
  const drawn = points.filter(p => p.y !== null && Number.isFinite(p.y));
  // The value beside the title: the last point of a line, the highlighted one of dots.
  const last = props.dots ? props.highlight : drawn[drawn.length - 1];
  const summary = last
    ? `${props.title}: ${drawn.length} points, ${props.dots ? 'best' : 'last'} ${format(last.y as number)} at ${props.xLabel} ${last.x}`
    : `${props.title}: ${drawn.length ? `${drawn.length} points` : 'no points yet'}`;

  let body: JSX.Element | null = null;
  if (drawn.length > 0) {
    // One step only: the point in the middle, over that step's number alone (not an axis of
    // made-up steps either side).
    const oneX = points.every(p => p.x === points[0].x);
    const [x0, x1] = extent(points.map(p => p.x));
    const [y0, y1] = extent(drawn.map(p => p.y as number));
    // As wide as the longer value label needs, so none is cut at the chart's left edge.
    const left = Math.max(
      PAD.left,
      8 + LABEL_CHAR_WIDTH * Math.max(format(y0).length, format(y1).length)
    );
    const plotW = width - left - PAD.right;
    const plotH = height - PAD.top - PAD.bottom;
    const sx = (x: number) =>
      oneX ? left + plotW / 2 : left + ((x - x0) / (x1 - x0)) * plotW;
    const sy = (y: number) => PAD.top + (1 - (y - y0) / (y1 - y0)) * plotH;
    const axis = {
      stroke: 'var(--jp-border-color1)',
      strokeWidth: 1
    };
    const label = {
      fill: 'var(--jp-ui-font-color2)',
      fontSize: 'var(--jp-ui-font-size0)',
      fontFamily: 'var(--jp-ui-font-family)'
    };
    body = (
      <>
        <line
          x1={left}
          y1={PAD.top + plotH}
          x2={left + plotW}
          y2={PAD.top + plotH}
          style={axis}
        />
        <line
          x1={left}
          y1={PAD.top}
          x2={left}
          y2={PAD.top + plotH}
          style={axis}
        />
        <text x={left - 4} y={PAD.top + 8} textAnchor="end" style={label}>
          {format(y1)}
        </text>
        <text x={left - 4} y={PAD.top + plotH} textAnchor="end" style={label}>
          {format(y0)}
        </text>
        {oneX ? (
          <text
            x={left + plotW / 2}
            y={height - 6}
            textAnchor="middle"
            style={label}
          >
            {`${props.xLabel} ${formatNumber(points[0].x)}`}
          </text>
        ) : (
          <>
            <text x={left} y={height - 6} textAnchor="start" style={label}>
              {formatNumber(x0)}
            </text>
            <text
              x={left + plotW}
              y={height - 6}
              textAnchor="end"
              style={label}
            >
              {formatNumber(x1)}
            </text>
            <text
              x={left + plotW / 2}
              y={height - 6}
              textAnchor="middle"
              style={label}
            >
              {props.xLabel}
            </text>
          </>
        )}
        <path
          className="jp-RemoteCompute-lineChartPath"
          d={props.dots ? '' : linePath(points, sx, sy)}
          fill="none"
          style={{
            stroke: 'var(--jp-brand-color1)',
            strokeWidth: 1.5,
            strokeLinejoin: 'round'
          }}
        />
        {props.dots &&
          drawn.map((p, i) => (
            <circle
              key={i}
              className="jp-RemoteCompute-lineChartDot"
              cx={sx(p.x)}
              cy={sy(p.y as number)}
              r={p === props.highlight ? 4 : 2.5}
              style={{ fill: 'var(--jp-brand-color1)' }}
            />
          ))}
        {!props.dots && drawn.length === 1 && (
          <circle
            cx={sx(drawn[0].x)}
            cy={sy(drawn[0].y as number)}
            r={2.5}
            style={{ fill: 'var(--jp-brand-color1)' }}
          />
        )}
      </>
    );
  }

  return (
    <figure className="jp-RemoteCompute-lineChart" style={{ margin: 0 }}>
      <figcaption
        style={{
          color: 'var(--jp-ui-font-color1)',
          fontSize: 'var(--jp-ui-font-size1)',
          display: 'flex',
          justifyContent: 'space-between',
          gap: '8px'
        }}
      >
        <span>{props.title}</span>
        {last && (
          <span
            className="jp-RemoteCompute-lineChartLast"
            style={{ color: 'var(--jp-ui-font-color2)' }}
          >
            {format(last.y as number)}
          </span>
        )}
      </figcaption>
      <svg
        role="img"
        aria-label={summary}
        viewBox={`0 0 ${width} ${height}`}
        style={{ width: '100%', maxWidth: `${width * 1.5}px`, height: 'auto' }}
      >
        <title>{summary}</title>
        {body}
      </svg>
    </figure>
  );
}
