// A scrolling line chart on a canvas: one line per named series over the last HISTORY
// points, y from 0 to a rounded maximum, optional dashed limit lines (a budget).

const HISTORY = 120;  // points kept per series: two minutes at one scrape a second
const PALETTE = ["#2563eb", "#16a34a", "#d97706", "#9333ea", "#0891b2", "#db2777", "#65a30d", "#475569"];

function niceCeil(value) {
  if (!(value > 0)) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 4, 8, 10]) {  // quarters of these are round numbers (the grid has four rows)
    if (value <= step * magnitude) return step * magnitude;
  }
  return 10 * magnitude;
}

function format(value) {
  if (value === 0) return "0";
  const abs = Math.abs(value);
  if (abs >= 100) return value.toFixed(0);
  if (abs >= 10) return value.toFixed(1);
  return value.toPrecision(2);
}

export class LineChart {
  constructor(container, { title, unit, minMax = 1, limits = [] }) {
    this.unit = unit;
    this.minMax = minMax;  // the y axis reaches at least this, so near-zero noise stays flat
    this.limits = limits;  // [{name, color}] drawn dashed at setLimit's value
    this.limitValues = new Map();
    this.series = new Map();  // name -> {color, points: (number|null)[]}
    this.points = 0;
    const figure = document.createElement("section");
    figure.className = "panel chart";
    const heading = document.createElement("h2");
    heading.textContent = title;
    this.readout = document.createElement("output");
    heading.append(this.readout);
    this.canvas = document.createElement("canvas");
    this.legend = document.createElement("div");
    this.legend.className = "legend";
    figure.append(heading, this.canvas, this.legend);
    container.append(figure);
    this.element = figure;
  }

  setLimit(name, value) {
    this.limitValues.set(name, value);
  }

  // One point in time: {seriesName: value or null (no data)}. Series not named get null.
  push(values) {
    for (const name of Object.keys(values)) {
      if (!this.series.has(name)) {
        this.series.set(name, { color: PALETTE[this.series.size % PALETTE.length],
                                points: new Array(this.points).fill(null) });
      }
    }
    for (const [name, s] of this.series) {
      s.points.push(values[name] ?? null);
      if (s.points.length > HISTORY) s.points.shift();
    }
    this.points = Math.min(this.points + 1, HISTORY);
    let shown = Object.entries(values).filter(([, v]) => v !== null && v !== undefined);
    if (shown.length > 3) shown = shown.sort((a, b) => b[1] - a[1]).slice(0, 3);  // the largest, of many
    this.readout.textContent = shown
      .map(([name, v]) => (this.series.size > 1 ? `${name} ` : "") + `${format(v)} ${this.unit}`)
      .join(" \u00b7 ");
    this.renderLegend();
    this.draw();
  }

  renderLegend() {
    const entries = [...this.series].map(([name, s]) => [name, s.color]);
    for (const limit of this.limits) {
      if (this.limitValues.has(limit.name)) entries.push([`${limit.name} (${format(this.limitValues.get(limit.name))})`, limit.color]);
    }
    const key = JSON.stringify(entries);
    if (key === this.legendKey) return;
    this.legendKey = key;
    this.legend.replaceChildren(...entries.map(([name, color]) => {
      const span = document.createElement("span");
      span.textContent = name;
      span.style.setProperty("--swatch", color);
      return span;
    }));
  }

  draw() {
    const ratio = window.devicePixelRatio || 1;
    const width = Math.max(1, Math.round(this.canvas.clientWidth * ratio));
    const height = Math.max(1, Math.round(this.canvas.clientHeight * ratio));
    if (this.canvas.width !== width || this.canvas.height !== height) {
      this.canvas.width = width;
      this.canvas.height = height;
    }
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const w = width / ratio;
    const h = height / ratio;
    const left = 44;
    const bottom = h - 16;
    const top = 6;
    ctx.clearRect(0, 0, w, h);

    let max = this.minMax;
    for (const s of this.series.values()) for (const v of s.points) if (v !== null && v > max) max = v;
    for (const v of this.limitValues.values()) if (v > max) max = v;
    max = niceCeil(max * 1.05);
    const y = (v) => bottom - (Math.min(v, max) / max) * (bottom - top);
    const x = (i) => left + (i / (HISTORY - 1)) * (w - left - 4);

    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#667085";
    ctx.strokeStyle = "#e5e7eb";
    ctx.lineWidth = 1;
    for (let k = 0; k <= 4; k++) {
      const v = (max * k) / 4;
      ctx.beginPath();
      ctx.moveTo(left, y(v));
      ctx.lineTo(w - 4, y(v));
      ctx.stroke();
      ctx.fillText(format(v), 2, y(v) + 4);
    }
    ctx.fillText(`${HISTORY} s`, left, h - 2);
    ctx.fillText("now", w - 26, h - 2);

    for (const limit of this.limits) {
      if (!this.limitValues.has(limit.name)) continue;
      ctx.save();
      ctx.setLineDash([6, 4]);
      ctx.strokeStyle = limit.color;
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      ctx.moveTo(left, y(this.limitValues.get(limit.name)));
      ctx.lineTo(w - 4, y(this.limitValues.get(limit.name)));
      ctx.stroke();
      ctx.restore();
    }

    const offset = HISTORY - this.points;  // newest point at the right edge
    for (const s of this.series.values()) {
      ctx.strokeStyle = s.color;
      ctx.lineWidth = 2;
      ctx.beginPath();
      let drawing = false;
      s.points.forEach((v, i) => {
        if (v === null) {
          drawing = false;
          return;
        }
        if (drawing) ctx.lineTo(x(offset + i), y(v)); else ctx.moveTo(x(offset + i), y(v));
        drawing = true;
      });
      ctx.stroke();
    }
  }
}
