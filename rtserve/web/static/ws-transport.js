// The fallback: WS /v1/realtime (OpenAI Realtime GA events), pcm16 24 kHz base64 audio both
// ways, captured and played by an AudioWorklet (pcm-worklet.js), or by a ScriptProcessor
// where the browser has no AudioWorklet.
import { ConnectError } from "./transport-errors.js";
import { LinearResampler, PlaybackQueue, WIRE_RATE, floatToPcm16Base64, pcm16Base64ToFloat } from "./pcm-stream.js";

const KEY_PROTOCOL = "openai-insecure-api-key.";  // browsers cannot set headers on a WebSocket
const MAX_SEND_BACKLOG = 1 << 20;  // bytes: over it, microphone chunks are dropped, not queued
const MAX_QUEUE_SECONDS = 30;  // agent audio waiting to play, beyond it the oldest is dropped
const PCM_24K = { type: "audio/pcm", rate: WIRE_RATE };

function realtimeUrl() {
  const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${window.location.host}/v1/realtime`;
}

// Resolves once the server has opened the session (session.created), so a full server or a
// refused key is an error of the connect, not of the call.
function sessionOpened(ws, onEvent, timeoutMs) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new ConnectError("the server did not open a session in time")),
                             timeoutMs);
    let refusal = null;
    ws.onmessage = (e) => {
      const event = JSON.parse(e.data);
      if (event.type === "error") {
        refusal = event.error || {};
      }
      onEvent(event);
      if (event.type === "session.created") {
        clearTimeout(timer);
        resolve();
      }
    };
    ws.onclose = (e) => {
      clearTimeout(timer);
      if (e.code === 4001) {
        reject(new ConnectError("the server refused the API key", { code: "invalid_api_key", status: 401 }));
      } else if (refusal) {
        reject(new ConnectError(refusal.message || "the server refused the session", { code: refusal.code }));
      } else {
        reject(new ConnectError(`WebSocket closed (${e.code}) before a session opened`));
      }
    };
  });
}

async function audioNodes(audio, micStream, onChunk, onPlayerStats) {
  const mic = audio.createMediaStreamSource(micStream);
  if (audio.audioWorklet) {
    await audio.audioWorklet.addModule("/static/pcm-worklet.js");
    const capture = new AudioWorkletNode(audio, "pcm-capture", { numberOfOutputs: 0 });
    capture.port.onmessage = (e) => onChunk(e.data);
    mic.connect(capture);
    const player = new AudioWorkletNode(audio, "pcm-player", {
      numberOfInputs: 0, outputChannelCount: [1], processorOptions: { maxQueueSeconds: MAX_QUEUE_SECONDS } });
    player.port.onmessage = (e) => onPlayerStats(e.data);
    return {
      output: player,
      play: (samples) => player.port.postMessage(samples, [samples.buffer]),
      clear: () => player.port.postMessage("clear"),
      disconnect: () => { mic.disconnect(); capture.disconnect(); player.disconnect(); },
    };
  }
  // No AudioWorklet: the same work on the main thread (audio glitches under a busy page).
  const node = audio.createScriptProcessor(2048, 1, 1);
  const toWire = new LinearResampler(audio.sampleRate, WIRE_RATE);
  const fromWire = new LinearResampler(WIRE_RATE, audio.sampleRate);
  const queue = new PlaybackQueue(MAX_QUEUE_SECONDS * audio.sampleRate);
  node.onaudioprocess = (e) => {
    onChunk(toWire.process(e.inputBuffer.getChannelData(0)));
    queue.pull(e.outputBuffer.getChannelData(0));
    onPlayerStats({ played: queue.played, energy: queue.energy, queued: queue.queued, dropped: queue.dropped,
                    rate: audio.sampleRate });
  };
  mic.connect(node);
  return {
    output: node,
    play: (samples) => queue.push(fromWire.process(samples)),
    clear: () => queue.clear(),
    disconnect: () => { mic.disconnect(); node.disconnect(); },
  };
}

export async function connectWebSocket({ key, micStream, audio, onEvent, onClose, timeoutMs = 10000 }) {
  const protocols = ["realtime", ...(key ? [KEY_PROTOCOL + key] : [])];
  let ws;
  try {
    ws = new WebSocket(realtimeUrl(), protocols);
  } catch (err) {
    throw new ConnectError(`cannot open a WebSocket: ${err.message}`);
  }
  const player = { played: 0, energy: 0, rate: audio.sampleRate, dropped: 0 };
  let bytesIn = 0;
  let sentDrops = 0;
  let nodes = null;
  const handle = (event) => {
    if (event.type === "response.output_audio.delta" && nodes) {
      nodes.play(pcm16Base64ToFloat(event.delta));
    } else if (event.type === "input_audio_buffer.speech_started" && nodes) {
      nodes.clear();  // barge-in: the user talks over the answer, stop playing it at once
    }
    onEvent(event);
  };
  try {
    await sessionOpened(ws, handle, timeoutMs);
  } catch (err) {
    ws.close();
    throw err;
  }
  // The wire formats first, before any audio: 24 kHz pcm16 both ways.
  ws.send(JSON.stringify({ type: "session.update",
                           session: { type: "realtime", audio: { input: { format: PCM_24K },
                                                                 output: { format: PCM_24K } } } }));
  nodes = await audioNodes(audio, micStream, (chunk) => {
    if (ws.readyState !== WebSocket.OPEN) return;
    if (ws.bufferedAmount > MAX_SEND_BACKLOG) {
      sentDrops += 1;  // a stalled socket: drop this chunk rather than queue without bound
      return;
    }
    ws.send(JSON.stringify({ type: "input_audio_buffer.append", audio: floatToPcm16Base64(chunk) }));
  }, (stats) => Object.assign(player, stats));
  ws.onmessage = (e) => {
    bytesIn += e.data.length;
    let event;
    try {
      event = JSON.parse(e.data);
    } catch (_) {
      return;
    }
    handle(event);
  };
  let closed = false;
  ws.onclose = (e) => {
    nodes.disconnect();
    if (!closed) {
      closed = true;
      onClose(e.reason || `WebSocket closed (${e.code})`);
    }
  };
  return {
    kind: "websocket",
    output: nodes.output,
    send(event) {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(event));
    },
    clearPlayback() {
      nodes.clear();
    },
    async stats() {
      // No getStats on a WebSocket: round trip and jitter are WebRTC's numbers.
      return { transport: "websocket", connection: ws.readyState === WebSocket.OPEN ? "connected" : "closed",
               rttMs: null, jitterMs: null, bytesIn, packetsLost: sentDrops,
               playedSeconds: player.played / player.rate,
               energy: player.energy / player.rate };
    },
    close() {
      if (closed) return;
      closed = true;
      nodes.disconnect();
      ws.close(1000, "hang up");
    },
  };
}
