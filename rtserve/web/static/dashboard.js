// The operator dashboard: scrapes this server's /metrics once a second and charts what an
// operator watches live. Rates and quantiles come from the difference of two scrapes, as
// Prometheus' rate() and histogram_quantile() compute them. With workers, /metrics holds
// every process (worker samples labelled worker="i"; unlabelled: the engine process); with
// engines as Ray actors it holds every engine actor's samples labelled engine="NAME", and the
// cluster charts show slots used and free and the mean tick time per engine. The cascade
// (embedded voice agent) charts show its voice turns stage by stage, per route, over the last
// minute (turns come seconds apart: one second between scrapes mostly holds none).
// GPU memory is what torch's caching allocator of each process holds (rtserve_torch_cuda_memory_bytes).
// `window.rtserveDashboard` mirrors the latest numbers for scripts and the browser tests.
import { LineChart } from "./charts.js";
import { Exposition, quantile, rate } from "./prometheus-text.js";

const INTERVAL_MS = 1000;
const TIMEOUT_MS = 5000;
const $ = (id) => document.getElementById(id);

const grid = $("charts");
const charts = {
  tick: new LineChart(grid, { title: "Lockstep tick time", unit: "ms", minMax: 10,
                              limits: [{ name: "budget", color: "#dc2626" }] }),
  sessions: new LineChart(grid, { title: "Live sessions per route", unit: "", minMax: 2 }),
  underruns: new LineChart(grid, { title: "Underruns (slot ticks that found no input)", unit: "/s", minMax: 1 }),
  silence: new LineChart(grid, { title: "Silence stepped for lack of input (partial frames too)", unit: "ms/s",
                                 minMax: 10 }),
  drops: new LineChart(grid, { title: "Drops and overruns", unit: "/s", minMax: 1 }),
  cpu: new LineChart(grid, { title: "CPU per process", unit: "%", minMax: 10 }),
  lag: new LineChart(grid, { title: "Event loop lag, p99", unit: "ms", minMax: 5 }),
  gpuMemory: new LineChart(grid, { title: "GPU memory per process (torch's allocator)", unit: "GB", minMax: 1 }),
  engineSlots: new LineChart(grid, { title: "Cluster: slots used and free per engine", unit: "", minMax: 2 }),
  engineTick: new LineChart(grid, { title: "Cluster: mean tick time per engine", unit: "ms", minMax: 10 }),
  turnStages: new LineChart(grid, { title: "Voice turn stages (cascade), p50 over 1 min", unit: "ms", minMax: 100 }),
  llmSpeed: new LineChart(grid, { title: "LLM decode speed (cascade), p50 over 1 min", unit: "tok/s", minMax: 10 }),
};

const dashboard = { scrapes: 0, error: null, latest: null };
window.rtserveDashboard = dashboard;

let previous = null;  // {at: seconds, scrape: Exposition}
const WINDOW_S = 60;
const history = [];  // the scrapes of the last WINDOW_S seconds, oldest first: {at, scrape}

// Live-session gauges: one line per route (label) or per family (rtserve_X_connections).
const SESSION_GAUGE = /^rtserve_(.+?)_(?:open_)?(connections|calls)$/;
const SILENCE = "rtserve_lockstep_silence_stepped_seconds_total";
const DROPS = {
  "input frames dropped": "rtserve_lockstep_dropped_input_frames_total",
  "output frames dropped": "rtserve_lockstep_dropped_output_frames_total",
  "output overflows": "rtserve_session_output_overflows_total",
  "tick overruns": "rtserve_lockstep_overruns_total",
  "deadlines skipped": "rtserve_lockstep_skipped_deadlines_total",
  "WebRTC mic frames dropped": "rtserve_webrtc_inbound_dropped_frames_total",
  "WebRTC agent frames late": "rtserve_webrtc_outbound_late_frames_total",
};
const TICK = "rtserve_lockstep_tick_seconds";
const STEP = "rtserve_lockstep_step_seconds";
const LAG = "rtserve_event_loop_lag_seconds";
const CPU = "process_cpu_seconds_total";
const SLOTS = "rtserve_lockstep_slots";
const LIVE_SLOTS = "rtserve_lockstep_live_slots";
const TURN = "rtserve_cascade_turn_seconds";
const LLM_SPEED = "rtserve_cascade_llm_tokens_per_second";
const GPU_MEMORY = "rtserve_torch_cuda_memory_bytes";

function ms(seconds) {
  return seconds === null || seconds === undefined ? null : seconds * 1000;
}

// Increase of counter `name` between the scrapes, per second (null on the first scrape).
function perSecond(now, before, seconds, name) {
  return rate(now.total(name), before ? before.total(name) : undefined, seconds);
}

// Mean of a histogram's observations made between the two scrapes.
function meanBetween(now, before, name) {
  if (!before || !now.has(`${name}_count`)) return null;
  const count = now.total(`${name}_count`) - (before.total(`${name}_count`) ?? 0);
  const sum = now.total(`${name}_sum`) - (before.total(`${name}_sum`) ?? 0);
  return count > 0 ? sum / count : null;
}

function tickTimes(now, before, seconds) {
  if (!now.has(`${TICK}_count`)) return null;
  const byLe = (scrape) => scrape.sum(`${TICK}_bucket`, (l) => l.le);
  return {
    mean: ms(meanBetween(now, before, TICK)),
    p99: before ? ms(quantile(0.99, byLe(now), byLe(before))) : null,
    step: ms(meanBetween(now, before, STEP)),
    budget: ms(now.total("rtserve_lockstep_frame_budget_seconds") ?? null),
    perSecond: perSecond(now, before, seconds, `${TICK}_count`),
  };
}

function liveSessions(now) {
  const out = {};
  for (const [name, samples] of now.samples) {
    const match = SESSION_GAUGE.exec(name);
    if (!match || now.types.get(name) !== "gauge") continue;
    for (const s of samples) {
      const route = s.labels.route || match[1];
      out[route] = (out[route] || 0) + s.value;
    }
  }
  if (now.has("rtserve_lockstep_live_slots")) out["engine slots"] = now.total("rtserve_lockstep_live_slots");
  return out;
}

// Process names: "worker i" for samples a worker pushed, "engine NAME" for an engine actor's;
// the rest are the engine process's (with workers) or the one front-end process's.
function processOf(scrape) {
  const cpu = scrape.samples.get(CPU) || [];
  const withWorkers = cpu.some((s) => s.labels.worker !== undefined);
  const withEngines = cpu.some((s) => s.labels.engine !== undefined);
  return (labels) => (labels.engine !== undefined ? `engine ${labels.engine}`
    : labels.worker !== undefined ? `worker ${labels.worker}`
      : withWorkers ? "engine" : withEngines ? "front-end" : "server");
}

// Per engine actor (samples labelled engine="NAME"): slots used and free, and the mean tick
// time between the two scrapes. Empty without a cluster.
function engines(now, before) {
  const byEngine = (scrape, name) => (scrape ? scrape.sum(name, (l) => l.engine) : new Map());
  const slots = byEngine(now, SLOTS);
  const live = byEngine(now, LIVE_SLOTS);
  const [count, sum] = [byEngine(now, `${TICK}_count`), byEngine(now, `${TICK}_sum`)];
  const [countBefore, sumBefore] = [byEngine(before, `${TICK}_count`), byEngine(before, `${TICK}_sum`)];
  const out = {};
  for (const [engine, capacity] of slots) {
    if (engine === undefined) continue;
    const used = live.get(engine) ?? 0;
    const ticks = before ? (count.get(engine) ?? 0) - (countBefore.get(engine) ?? 0) : 0;
    const seconds = (sum.get(engine) ?? 0) - (sumBefore.get(engine) ?? 0);
    out[engine] = { slots: capacity, used, free: capacity - used, meanTickMs: ticks > 0 ? ms(seconds / ticks) : null };
  }
  return out;
}

function cpuPercent(now, before, seconds) {
  const current = now.sum(CPU, processOf(now));
  const earlier = before ? before.sum(CPU, processOf(before)) : new Map();
  const out = {};
  for (const [process, value] of current) {
    const r = rate(value, earlier.get(process), seconds);
    out[process] = r === null ? null : 100 * r;
  }
  return out;
}

// GB per "process kind" (kind: reserved from the driver, allocated in tensors), the device named
// where a process uses several; empty where no process has used CUDA through torch.
function gpuMemory(now) {
  const processOfLabels = processOf(now);
  const devices = new Map();  // process -> the devices it reports
  for (const s of now.samples.get(GPU_MEMORY) || []) {
    const process = processOfLabels(s.labels);
    devices.set(process, (devices.get(process) || new Set()).add(s.labels.device));
  }
  const out = {};
  for (const s of now.samples.get(GPU_MEMORY) || []) {
    const process = processOfLabels(s.labels);
    const device = devices.get(process).size > 1 ? ` cuda:${s.labels.device}` : "";
    out[`${process}${device} ${s.labels.kind}`] = s.value / 1e9;
  }
  return out;
}

// Histogram `name`'s buckets summed per keyOf(labels): Map key -> Map le -> count.
function bucketsBy(scrape, name, keyOf) {
  const out = new Map();
  for (const s of scrape.samples.get(`${name}_bucket`) || []) {
    const key = keyOf(s.labels);
    if (!out.has(key)) out.set(key, new Map());
    const le = out.get(key);
    le.set(s.labels.le, (le.get(s.labels.le) || 0) + s.value);
  }
  return out;
}

// The q-quantile per key of what histogram `name` observed since `before` (null: nothing).
function quantilesBy(q, now, before, name, keyOf) {
  const earlier = before ? bucketsBy(before, name, keyOf) : new Map();
  const out = {};
  for (const [key, le] of bucketsBy(now, name, keyOf)) out[key] = quantile(q, le, earlier.get(key));
  return out;
}

function loopLagP99(now, before) {
  const out = {};
  if (!before) {
    for (const process of bucketsBy(now, LAG, processOf(now)).keys()) out[process] = null;
    return out;
  }
  for (const [process, p99] of Object.entries(quantilesBy(0.99, now, before, LAG, processOf(now)))) {
    out[process] = ms(p99);
  }
  return out;
}

// The cascade's voice turns over the window: p50 ms per "stage route", LLM tokens/s per route.
function voiceTurns(now, oldest) {
  if (!now.has(`${TURN}_count`) && !now.types.has(TURN)) return null;
  const stages = {};
  for (const [key, p50] of Object.entries(quantilesBy(0.5, now, oldest, TURN, (l) => `${l.stage} ${l.route}`))) {
    stages[key] = ms(p50);
  }
  return { stages, llmTokensPerS: quantilesBy(0.5, now, oldest, LLM_SPEED, (l) => l.route || "(no route)") };
}

function update(now, at) {
  const before = previous && previous.scrape;
  const seconds = previous ? at - previous.at : 0;
  const ticks = tickTimes(now, before, seconds);
  const drops = {};
  for (const [label, name] of Object.entries(DROPS)) {
    if (now.has(name)) drops[label] = perSecond(now, before, seconds, name);
  }
  const underruns = now.has("rtserve_lockstep_underruns_total")
    ? { underruns: perSecond(now, before, seconds, "rtserve_lockstep_underruns_total") } : {};
  const silenceRate = perSecond(now, before, seconds, SILENCE);  // seconds of silence a second
  const silence = now.has(SILENCE) ? { "silence stepped": silenceRate === null ? null : 1000 * silenceRate } : {};
  while (history.length && history[0].at < at - WINDOW_S) history.shift();
  const oldest = history.length ? history[0].scrape : null;
  const latest = { at, tick: ticks, sessions: liveSessions(now), underruns, silence, drops,
                   cpuPercent: cpuPercent(now, before, seconds), lagP99Ms: loopLagP99(now, before), gpuMemoryGB: gpuMemory(now),
                   engines: engines(now, before), voiceTurns: voiceTurns(now, oldest) };
  previous = { at, scrape: now };
  history.push(previous);
  dashboard.latest = latest;
  dashboard.scrapes += 1;

  if (ticks) {
    if (ticks.budget !== null) charts.tick.setLimit("budget", ticks.budget);
    charts.tick.push({ "mean tick": ticks.mean, "p99 tick": ticks.p99, "mean model step": ticks.step });
  } else {
    charts.tick.push({});
    charts.tick.readout.textContent = "no lockstep engine on this server";
  }
  charts.sessions.push(latest.sessions);
  charts.underruns.push(underruns);
  charts.silence.push(silence);
  charts.drops.push(drops);
  charts.cpu.push(latest.cpuPercent);
  charts.lag.push(latest.lagP99Ms);
  charts.gpuMemory.push(latest.gpuMemoryGB);
  if (!Object.keys(latest.gpuMemoryGB).length) {
    charts.gpuMemory.readout.textContent = "no process of this server holds GPU memory through torch";
  }
  const slotSeries = {};
  const tickSeries = {};
  for (const [engine, e] of Object.entries(latest.engines)) {
    slotSeries[`${engine} used`] = e.used;
    slotSeries[`${engine} free`] = e.free;
    tickSeries[engine] = e.meanTickMs;
  }
  charts.engineSlots.push(slotSeries);
  charts.engineTick.push(tickSeries);
  if (!Object.keys(latest.engines).length) {
    charts.engineSlots.readout.textContent = "no engine actors (not a Ray cluster front-end)";
    charts.engineTick.readout.textContent = "no engine actors (not a Ray cluster front-end)";
  }
  const turns = latest.voiceTurns;
  charts.turnStages.push(turns ? turns.stages : {});
  charts.llmSpeed.push(turns ? turns.llmTokensPerS : {});
  if (!turns) {
    charts.turnStages.readout.textContent = "no cascade engine on this server";
    charts.llmSpeed.readout.textContent = "no cascade engine on this server";
  }
}

function setState(state, text) {
  const badge = $("state");
  badge.dataset.state = state;
  badge.textContent = text;
}

async function scrape() {
  const key = $("api-key").value.trim();
  try {
    const response = await fetch("/metrics", {
      headers: key ? { Authorization: `Bearer ${key}` } : {}, cache: "no-store",
      signal: AbortSignal.timeout(TIMEOUT_MS),
    });
    if (response.status === 401) {
      dashboard.error = "the server needs its API key";
      setState("failed", "enter the server's API key");
      return;
    }
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const text = await response.text();
    update(new Exposition(text), performance.now() / 1000);
    dashboard.error = null;
    setState("connected", "live");
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    dashboard.error = String(err.message || err);
    setState("failed", `cannot read /metrics: ${dashboard.error}`);
  }
}

async function loop() {
  for (;;) {
    const started = performance.now();
    await scrape();
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, INTERVAL_MS - (performance.now() - started))));
  }
}

window.addEventListener("resize", () => Object.values(charts).forEach((chart) => chart.draw()));
loop();
