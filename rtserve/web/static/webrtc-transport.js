// The OpenAI Realtime browser flow over WebRTC: microphone track and an `oai-events` data
// channel in an SDP offer, POSTed as application/sdp to /v1/realtime/calls; the answer's
// audio track is the agent. Events on the data channel are the same JSON as /v1/realtime.
import { ConnectError, errorFromResponse } from "./transport-errors.js";

const CALLS_URL = "/v1/realtime/calls";
const OPUS_RATE = 48000;
const GATHER_TIMEOUT_MS = 2000;  // host candidates on a LAN take milliseconds; never wait long
// A route that is not there (an older server, a proxy that does not pass it): try WebSocket.
const NO_ROUTE_STATUSES = [404, 405, 501, 502, 503];

function authHeaders(key) {
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// The offer with every local candidate in it: the server answers once, so candidates that
// arrive after the offer was sent would never reach it.
function gathered(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(done, GATHER_TIMEOUT_MS);
    function done() {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    }
    function check() {
      if (pc.iceGatheringState === "complete") done();
    }
    pc.addEventListener("icegatheringstatechange", check);
  });
}

function opened(pc, channel, timeoutMs) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => fail("WebRTC did not connect within "
                                        + `${Math.round(timeoutMs / 1000)} s (UDP blocked?)`), timeoutMs);
    function fail(message) {
      clearTimeout(timer);
      reject(new ConnectError(message, { fallback: true }));
    }
    pc.addEventListener("connectionstatechange", () => {
      if (pc.connectionState === "failed") fail("WebRTC connection failed (ICE found no path to the server)");
    });
    channel.addEventListener("open", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

export async function connectWebRtc({
  key, micStream, cameraStream = null, audioElement, onEvent, onClose, timeoutMs = 10000,
}) {
  if (typeof RTCPeerConnection === "undefined") {
    throw new ConnectError("this browser has no WebRTC", { fallback: true });
  }
  const pc = new RTCPeerConnection();
  let callUrl = null;
  let closed = false;
  const remote = new MediaStream();
  try {
    pc.addTransceiver(micStream.getAudioTracks()[0], { direction: "sendrecv", streams: [micStream] });
    // The camera (docs/video.md#webrtc-video): send only; switched off by sending no track, not black frames.
    const camera = cameraStream
      ? pc.addTransceiver(cameraStream.getVideoTracks()[0], { direction: "sendonly", streams: [cameraStream] })
      : null;
    pc.addEventListener("track", (e) => {
      remote.addTrack(e.track);
      audioElement.srcObject = remote;
    });
    const channel = pc.createDataChannel("oai-events");
    channel.addEventListener("message", (e) => {
      let event;
      try {
        event = JSON.parse(e.data);
      } catch (_) {
        return;  // not an event; the server only sends JSON
      }
      onEvent(event);
    });

    await pc.setLocalDescription(await pc.createOffer());
    await gathered(pc);
    let response;
    try {
      response = await fetch(CALLS_URL, {
        method: "POST", body: pc.localDescription.sdp,
        headers: { "Content-Type": "application/sdp", ...authHeaders(key) },
      });
    } catch (err) {
      throw new ConnectError(`could not reach ${CALLS_URL}`, { fallback: true });
    }
    if (response.status !== 201) {
      throw await errorFromResponse(response, "WebRTC call", { fallbackStatuses: NO_ROUTE_STATUSES });
    }
    const location = response.headers.get("Location");
    callUrl = location ? new URL(location, window.location.href).pathname : null;
    await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
    await opened(pc, channel, timeoutMs);

    const finish = (reason) => {
      if (closed) return;
      closed = true;
      onClose(reason);
    };
    channel.addEventListener("close", () => finish("the server ended the call"));
    pc.addEventListener("connectionstatechange", () => {
      if (pc.connectionState === "failed" || pc.connectionState === "closed") finish(`connection ${pc.connectionState}`);
    });

    return {
      kind: "webrtc",
      remoteStream: remote,
      send(event) {
        if (channel.readyState === "open") channel.send(JSON.stringify(event));
      },
      hasCamera: camera !== null,
      async showCamera(on) {
        if (camera) await camera.sender.replaceTrack(on ? cameraStream.getVideoTracks()[0] : null);
      },
      clearPlayback() {
        // The server purges the call's outbound queue itself (output_audio_buffer.cleared).
      },
      async stats() {
        return webRtcStats(pc, await pc.getStats());
      },
      close() {
        if (closed) return;
        closed = true;
        hangUp(callUrl, key);
        channel.close();
        pc.close();
      },
    };
  } catch (err) {
    closed = true;
    pc.close();
    throw err;
  }
}

// Best effort: the server also ends the call when the peer connection closes. An ek_ key
// admits only placing calls, so a call placed with one ends by that close alone.
function hangUp(callUrl, key) {
  if (!callUrl || (key && key.startsWith("ek_"))) return;
  fetch(`${callUrl}/hangup`, { method: "POST", keepalive: true, headers: authHeaders(key) }).catch(() => {});
}

function webRtcStats(pc, report) {
  const out = { transport: "webrtc", connection: pc.connectionState, rttMs: null, jitterMs: null,
                bytesIn: 0, packetsLost: 0, playedSeconds: 0, energy: 0 };
  let pairId = null;
  report.forEach((s) => {
    if (s.type === "transport" && s.selectedCandidatePairId) pairId = s.selectedCandidatePairId;
  });
  report.forEach((s) => {
    if (s.type === "candidate-pair" && (s.id === pairId || (!pairId && s.nominated && s.state === "succeeded"))
        && s.currentRoundTripTime !== undefined) {
      out.rttMs = s.currentRoundTripTime * 1000;
    } else if (s.type === "inbound-rtp" && s.kind === "audio") {
      out.jitterMs = (s.jitter || 0) * 1000;
      out.bytesIn = s.bytesReceived || 0;
      out.packetsLost = s.packetsLost || 0;
      // Samples the jitter buffer released to the speaker, less the ones it made up for lost
      // packets; WebRTC Opus plays out at 48 kHz.
      out.playedSeconds = ((s.totalSamplesReceived || 0) - (s.concealedSamples || 0)) / OPUS_RATE;
      out.energy = s.totalAudioEnergy || 0;
    }
  });
  return out;
}
