// Prometheus text exposition format 0.0.4 -> families of samples, and the arithmetic the
// dashboard does on two successive scrapes (rates, histogram quantiles).
// https://prometheus.io/docs/instrumenting/exposition_formats/

// "name{a="x",b="y\"z"} 1.5 [timestamp]" -> {name, labels, value}; null for anything else.
export function parseSample(line) {
  const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)/.exec(line);
  if (!match) return null;
  const name = match[1];
  let i = name.length;
  const labels = {};
  if (line[i] === "{") {
    i += 1;
    for (;;) {
      while (line[i] === " " || line[i] === ",") i += 1;
      if (line[i] === "}") { i += 1; break; }
      const key = /^[a-zA-Z_][a-zA-Z0-9_]*/.exec(line.slice(i));
      if (!key || line[i + key[0].length] !== "=" || line[i + key[0].length + 1] !== '"') return null;
      i += key[0].length + 2;
      let value = "";
      for (;;) {
        const ch = line[i];
        if (ch === undefined) return null;
        i += 1;
        if (ch === '"') break;
        if (ch === "\\") {
          const next = line[i];
          i += 1;
          value += next === "n" ? "\n" : next;
        } else {
          value += ch;
        }
      }
      labels[key[0]] = value;
    }
  }
  const rest = line.slice(i).trim().split(/\s+/);
  const value = parseValue(rest[0]);
  return Number.isNaN(value) && rest[0] !== "NaN" ? null : { name, labels, value };
}

function parseValue(text) {
  if (text === "+Inf" || text === "Inf") return Infinity;
  if (text === "-Inf") return -Infinity;
  return text === undefined || text === "" ? NaN : Number(text);
}

// One scrape: samples by sample name (x_total, x_bucket, ...), and the declared type of each
// family (# TYPE), so a gauge can be told from a counter's sample of the same stem.
export class Exposition {
  constructor(text) {
    this.types = new Map();  // family name -> "counter" | "gauge" | "histogram" | ...
    this.samples = new Map();  // sample name -> [{labels, value}]
    for (const raw of text.split("\n")) {
      const line = raw.trim();
      if (!line) continue;
      if (line.startsWith("#")) {
        const parts = line.split(/\s+/);
        if (parts[1] === "TYPE" && parts.length >= 4) this.types.set(parts[2], parts[3]);
        continue;
      }
      const sample = parseSample(line);
      if (!sample) continue;
      if (!this.samples.has(sample.name)) this.samples.set(sample.name, []);
      this.samples.get(sample.name).push(sample);
    }
  }

  has(name) {
    return this.samples.has(name);
  }

  // Sum of the samples called `name`, grouped by keyOf(labels).
  sum(name, keyOf = () => "") {
    const out = new Map();
    for (const s of this.samples.get(name) || []) {
      const key = keyOf(s.labels);
      out.set(key, (out.get(key) || 0) + s.value);
    }
    return out;
  }

  // Sum of every sample called `name`, across labels and processes; undefined if none.
  total(name) {
    return this.has(name) ? this.sum(name).get("") : undefined;
  }
}

// Per-second increase of a counter between two scrapes; a reset (restart) counts from zero.
export function rate(now, before, seconds) {
  if (before === undefined || seconds <= 0) return null;
  const delta = now >= before ? now - before : now;
  return delta / seconds;
}

// Histogram buckets (Map le -> cumulative count, le as exposed: "0.08", "+Inf"), their
// increase between two scrapes -> the q-quantile, interpolated linearly inside its bucket as
// Prometheus' histogram_quantile does. null when nothing was observed in between.
export function quantile(q, bucketsNow, bucketsBefore) {
  const rows = [...bucketsNow.entries()]
    .map(([le, count]) => [parseValue(le), Math.max(0, count - ((bucketsBefore && bucketsBefore.get(le)) || 0))])
    .sort((a, b) => a[0] - b[0]);
  const total = rows.length ? rows[rows.length - 1][1] : 0;
  if (!total) return null;
  const rank = q * total;
  let lower = 0;
  let below = 0;
  for (const [bound, count] of rows) {
    if (count >= rank) {
      if (bound === Infinity) return lower;  // above the top bucket: its lower edge, as Prometheus does
      const inBucket = count - below;
      return inBucket ? lower + (bound - lower) * ((rank - below) / inBucket) : bound;
    }
    lower = bound;
    below = count;
  }
  return null;
}
