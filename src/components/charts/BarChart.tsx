/**
 * A grouped bar chart in plain SVG: one group of bars per category, one bar per series.
 *
 * Colours, text and lines come from JupyterLab's CSS variables, so the chart follows the
 * light and dark themes without knowing which one is on.
 */
import * as React from 'react';

export interface IBarSeries {
  /**
   * Shown in the legend and in each bar's tooltip.
   */
  name: string;
  /**
   * One value per category, in the categories' order.
   */
  values: readonly number[];
  /**
   * A CSS colour, normally a JupyterLab variable such as `var(--jp-brand-color1)`.
   */
  color: string;
}

export interface IBarChartProps {
  /**
   * What the chart shows, for screen readers (the SVG's accessible name).
   */
  label: string;
  categories: readonly string[];
  series: readonly IBarSeries[];
  /**
   * How a value is written on the axis and in tooltips (e.g. `1.5 h`).
   */
  format?: (value: number) => string;
  /**
   * Formats the axis's ticks (default: `format`).
   */
  tickFormat?: (value: number) => string;
  height?: number;
}

const MARGIN = { top: 12, right: 12, bottom: 48, left: 56 };
const BAR_GAP = 2;
const GROUP_PADDING = 0.25; // of a group's width, left empty between groups
const MIN_GROUP_WIDTH = 36;
const TICKS = 4;
// What a character of a label takes at the lab's smallest UI font, generously.
const LABEL_CHAR_WIDTH = 6.5;

/**
 * A round upper bound for the axis: 1, 2 or 5 times a power of ten, at least ``max``.
 */
export function niceCeiling(max: number): number {
  if (!(max > 0) || !Number.isFinite(max)) {
    return 1;
  }
  const power = Math.pow(10, Math.floor(Math.log10(max)));
  for (const step of [1, 2, 5, 10]) {
    if (step * power >= max) {
      return step * power;
    }
  }
  return 10 * power;
}

export function BarChart(props: IBarChartProps): JSX.Element {
  const { label, categories, series } = props;
  const format = props.format ?? ((v: number) => v.toFixed(2));
  const tickFormat = props.tickFormat ?? format;
  const groupWidth = Math.max(
    MIN_GROUP_WIDTH,
    series.length * 16 + BAR_GAP * series.length
  );
  // The category labels are turned 30°: room for the longest below the axis and, for the first,
  // left of it, so none is cut at the chart's edge.
  const longest =
    Math.max(0, ...categories.map(c => c.length)) * LABEL_CHAR_WIDTH;
  const margin = {
    ...MARGIN,
    left: Math.max(MARGIN.left, longest * 0.87 - groupWidth / 2 + 6),
    bottom: Math.max(MARGIN.bottom, longest * 0.5 + 20)
  };
  const height = (props.height ?? 220) - MARGIN.bottom + margin.bottom;
  const plotHeight = height - margin.top - margin.bottom;
  const width =
    margin.left + margin.right + Math.max(1, categories.length) * groupWidth;
  const max = niceCeiling(
    Math.max(0, ...series.flatMap(s => s.values.filter(Number.isFinite)))
  );
  const y = (value: number): number =>
    margin.top + plotHeight - (Math.max(0, value) / max) * plotHeight;
  const inner = groupWidth * (1 - GROUP_PADDING);
  const barWidth = Math.max(
    2,
    (inner - BAR_GAP * (series.length - 1)) / Math.max(1, series.length)
  );
  const ticks = Array.from({ length: TICKS + 1 }, (_, i) => (max * i) / TICKS);

  return (
    <figure className="jp-RemoteCompute-chart">
      <svg
        role="img"
        aria-label={label}
        width={width}
        height={height}
        viewBox={`0 0 ${width} ${height}`}
        className="jp-RemoteCompute-barChart"
      >
        <title>{label}</title>
        {ticks.map(tick => (
          <g key={tick}>
            <line
              x1={margin.left}
              x2={width - margin.right}
              y1={y(tick)}
              y2={y(tick)}
              style={{ stroke: 'var(--jp-border-color2)', strokeWidth: 1 }}
            />
            <text
              x={margin.left - 6}
              y={y(tick)}
              textAnchor="end"
              dominantBaseline="middle"
              style={{
                fill: 'var(--jp-ui-font-color2)',
                fontSize: 'var(--jp-ui-font-size0)'
              }}
            >
              {tickFormat(tick)}
            </text>
          </g>
        ))}
        {categories.map((category, c) => {
          const left = margin.left + c * groupWidth + (groupWidth - inner) / 2;
          return (
            <g key={category} data-category={category}>
              {series.map((s, i) => {
                const value = s.values[c] ?? 0;
                const top = y(value);
                return (
                  <rect
                    key={s.name}
                    className="jp-RemoteCompute-bar"
                    x={left + i * (barWidth + BAR_GAP)}
                    y={top}
                    width={barWidth}
                    height={margin.top + plotHeight - top}
                    style={{ fill: s.color }}
                  >
                    <title>{`${category} · ${s.name}: ${format(value)}`}</title>
                  </rect>
                );
              })}
              <text
                x={margin.left + c * groupWidth + groupWidth / 2}
                y={margin.top + plotHeight + 8}
                textAnchor="end"
                dominantBaseline="hanging"
                transform={`rotate(-30 ${margin.left + c * groupWidth + groupWidth / 2} ${margin.top + plotHeight + 8})`}
                style={{
                  fill: 'var(--jp-ui-font-color1)',
                  fontSize: 'var(--jp-ui-font-size0)'
                }}
              >
                {category}
              </text>
            </g>
          );
        })}
        <line
          x1={margin.left}
          x2={width - margin.right}
          y1={margin.top + plotHeight}
          y2={margin.top + plotHeight}
          style={{ stroke: 'var(--jp-border-color1)', strokeWidth: 1 }}
        />
      </svg>
      <figcaption className="jp-RemoteCompute-legend">
        {series.map(s => (
          <span key={s.name} className="jp-RemoteCompute-legendItem">
            <svg width={10} height={10} aria-hidden="true">
              <rect width={10} height={10} style={{ fill: s.color }} />
            </svg>
            {s.name}
          </span>
        ))}
      </figcaption>
    </figure>
  );
}
