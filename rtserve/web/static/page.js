// The voice chat page: one call at a time, WebRTC first (the OpenAI browser flow against
// /v1/realtime/calls), the WebSocket route /v1/realtime when WebRTC cannot connect.
// `window.rtservePage` mirrors what the page shows (state, stats, transcript text) for
// scripts and the browser tests.
import { callKey } from "./client-secret.js";
import { LevelMeter } from "./level-meter.js";
import { Settings } from "./settings.js";
import { Transcript } from "./transcript.js";
import { ConnectError } from "./transport-errors.js";
import { connectWebRtc } from "./webrtc-transport.js";
import { connectWebSocket } from "./ws-transport.js";

const METER_MS = 100;
const STATS_MS = 1000;
const $ = (id) => document.getElementById(id);

const settings = new Settings($("settings"));
const transcript = new Transcript($("transcript"));
const page = {
  state: "idle", transport: null, stats: null, notice: null, fallbackReason: null, session: null, events: 0,
  connectMs: null,  // Connect pressed -> call up (microphone granted, offer answered, data channel open)
  firstAudioMs: null,  // Connect pressed -> the server's first agent audio (WebRTC: output_audio_buffer.started)
  agentText: () => transcript.text("agent"), userText: () => transcript.text("user"),
  cameraOn: false,  // the call sends camera frames now
};
window.rtservePage = page;

let call = null;  // {audio, mic, camera, transport, micMeter, agentMeter, timers}

function setState(state, label = state) {
  page.state = state;
  const badge = $("state");
  badge.dataset.state = state;
  badge.textContent = label;
  const busy = state === "connecting" || state === "connected";
  $("connect").disabled = busy;
  $("hangup").disabled = !busy;
  $("send-turn").disabled = state !== "connected";
}

function showNotice(kind, text) {
  page.notice = text ? { kind, text } : null;
  const box = $("notice");
  box.hidden = !text;
  box.dataset.kind = kind || "";
  box.textContent = text || "";
}

function showSendTurn() {
  $("send-turn").hidden = settings.value("turn_detection") !== "none";
}

function explain(err) {
  if (err instanceof ConnectError && err.serverFull) {
    return ["full", `The server is full: every session is in use. Try again in a moment. (${err.message})`];
  }
  if (err instanceof ConnectError && err.keyRejected) {
    return ["error", "The server needs its API key (or an ek_ key minted with it): enter it in the API key field."];
  }
  return ["error", `Could not connect: ${err.message}`];
}

function onServerEvent(event) {
  page.events += 1;
  if (page.firstAudioMs === null && call
      && (event.type === "output_audio_buffer.started" || event.type === "response.output_audio.delta")) {
    page.firstAudioMs = performance.now() - call.started;
  }
  if (transcript.apply(event)) return;
  switch (event.type) {
    case "session.created":
    case "session.updated":
      page.session = event.session;
      settings.showSession(event.session);
      break;
    case "error": {
      const error = event.error || {};
      if (error.code === "resource_exhausted") {
        showNotice("full", `The server is full: ${error.message || "every session is in use"}`);
      } else {
        showNotice("error", `Server: ${error.message || error.code || "error"}`);
      }
      break;
    }
    case "input_audio_buffer.speech_started":
      $("speaking").textContent = "you are speaking";
      break;
    case "input_audio_buffer.speech_stopped":
      $("speaking").textContent = "";
      break;
    case "output_audio_buffer.started":
      $("speaking").textContent = "agent speaking";
      break;
    case "output_audio_buffer.stopped":
      $("speaking").textContent = "";
      break;
    case "output_audio_buffer.cleared":
      $("speaking").textContent = "agent interrupted";
      break;
    default:
      break;
  }
}

async function openTransport(c) {
  const mode = settings.value("transport");
  const typed = $("api-key").value.trim();
  const common = { micStream: c.mic, onEvent: onServerEvent, onClose: (reason) => ended(c, reason) };
  if (c.camera && mode === "websocket") throw new Error("the camera needs WebRTC: pick a WebRTC transport");
  if (mode !== "websocket") {
    setState("connecting", "connecting (WebRTC)\u2026");
    try {
      const key = await callKey(typed);
      return await connectWebRtc({ ...common, key, cameraStream: c.camera, audioElement: $("agent-audio") });
    } catch (err) {
      if (mode === "webrtc" || c.camera || !(err instanceof ConnectError && err.fallback)) throw err;
      page.fallbackReason = err.message;
      showNotice("info", `WebRTC could not connect (${err.message}); using the WebSocket fallback.`);
    }
  }
  setState("connecting", "connecting (WebSocket)\u2026");
  return connectWebSocket({ ...common, key: typed || null, audio: c.audio });
}

function agentMeter(c, transport) {
  if (transport.kind === "websocket") {
    transport.output.connect(c.audio.destination);
    return new LevelMeter(c.audio, transport.output);
  }
  // The <audio> element plays the call; this only measures it.
  return new LevelMeter(c.audio, c.audio.createMediaStreamSource(transport.remoteStream));
}

function renderMeters(c) {
  for (const [meter, bar, label] of [[c.micMeter, "mic-level", "mic-db"], [c.agentMeter, "agent-level", "agent-db"]]) {
    if (!meter) continue;
    const db = meter.read();
    $(bar).style.width = `${Math.round(100 * LevelMeter.fraction(db))}%`;
    $(label).textContent = `${db.toFixed(0)} dB`;
  }
}

async function renderStats(c) {
  if (!c.transport) return;
  const s = await c.transport.stats();
  page.stats = s;
  const ms = (v) => (v === null ? "n/a over WebSocket" : `${v.toFixed(1)} ms`);
  $("stat-transport").textContent = s.transport + (page.fallbackReason ? " (fallback)" : "");
  $("stat-connection").textContent = s.connection;
  $("stat-rtt").textContent = ms(s.rttMs);
  $("stat-jitter").textContent = ms(s.jitterMs);
  $("stat-bytes").textContent = `${(s.bytesIn / 1024).toFixed(1)} KiB`;
  $("stat-played").textContent = `${s.playedSeconds.toFixed(1)} s`;
  $("stat-lost").textContent = String(s.packetsLost);
}

// The self-view shows what the call sends; the checkbox switches the camera during a call
// (a call placed without it needs a new call to add it: no renegotiation).
function showSelfView(stream) {
  const view = $("self-view");
  view.srcObject = stream;
  view.hidden = !stream;
  page.cameraOn = Boolean(stream);
}

async function toggleCamera() {
  const on = $("camera").checked;
  if (!call || !call.transport) return;
  if (!call.transport.hasCamera) {
    if (on) showNotice("info", "The camera joins with the next call: hang up and connect again.");
    return;
  }
  await call.transport.showCamera(on);
  showSelfView(on ? call.camera : null);
}

function release(c) {
  for (const timer of c.timers) clearInterval(timer);
  for (const track of c.mic ? c.mic.getTracks() : []) track.stop();
  for (const track of c.camera ? c.camera.getTracks() : []) track.stop();
  showSelfView(null);
  $("agent-audio").srcObject = null;
  c.audio.close().catch(() => {});  // already closed: nothing left to release
  if (call === c) call = null;
}

function ended(c, reason) {
  if (call !== c) return;
  release(c);
  setState("idle", `ended: ${reason}`);
}

async function connect() {
  if (call) return;
  showNotice(null);
  page.fallbackReason = null;
  page.connectMs = null;
  page.firstAudioMs = null;
  transcript.clear();
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    showNotice("error", "The microphone needs a secure page: open it over https:// (rtserve serve --ssl-certfile "
               + "--ssl-keyfile) or on localhost.");
    return;
  }
  // Created in the click handler: a page may start audio only from a user gesture.
  const c = {
    audio: new AudioContext(), mic: null, camera: null, transport: null, timers: [], started: performance.now(),
  };
  call = c;
  setState("connecting", "opening the microphone\u2026");
  try {
    c.mic = await navigator.mediaDevices.getUserMedia(settings.microphoneConstraints());
    c.micMeter = new LevelMeter(c.audio, c.audio.createMediaStreamSource(c.mic));
    if ($("camera").checked) {
      setState("connecting", "opening the camera\u2026");
      c.camera = await navigator.mediaDevices.getUserMedia({ video: { width: 640, height: 480, frameRate: 15 } });
    }
    const transport = await openTransport(c);
    if (call !== c) {  // hung up while connecting
      transport.close();
      return;
    }
    c.transport = transport;
    page.transport = transport.kind;
    page.connectMs = performance.now() - c.started;
    $("stat-connect").textContent = `${page.connectMs.toFixed(0)} ms`;
    c.agentMeter = agentMeter(c, transport);
    if (c.camera) showSelfView(c.camera);
    setState("connected", `connected \u00b7 ${transport.kind === "webrtc" ? "WebRTC" : "WebSocket"}`);
    const update = settings.sessionUpdate();
    if (Object.keys(update.session).length > 1) transport.send(update);
    c.timers.push(setInterval(() => renderMeters(c), METER_MS));
    c.timers.push(setInterval(() => renderStats(c).catch(() => {}), STATS_MS));
  } catch (err) {
    if (call !== c) return;
    const [kind, text] = explain(err);
    showNotice(kind, text);
    release(c);
    setState(kind === "full" ? "full" : "failed", kind === "full" ? "server full" : "not connected");
  }
}

function hangUp() {
  const c = call;
  if (!c) return;
  if (c.transport) c.transport.close();
  release(c);
  setState("idle", "hung up");
}

$("connect").addEventListener("click", connect);
$("hangup").addEventListener("click", hangUp);
$("send-turn").addEventListener("click", () => {
  if (!call || !call.transport) return;
  call.transport.send({ type: "input_audio_buffer.commit" });
  call.transport.send({ type: "response.create" });
});
$("settings").addEventListener("submit", (e) => {
  e.preventDefault();
  settings.save();
  if (call && call.transport) call.transport.send(settings.sessionUpdate());
});
$("settings").elements.turn_detection.addEventListener("change", showSendTurn);
$("camera").addEventListener("change", () => toggleCamera().catch((err) => showNotice("error", err.message)));
window.addEventListener("pagehide", hangUp);
showSendTurn();
setState("idle");
