// PCM helpers of the WebSocket fallback, shared by the AudioWorklet (pcm-worklet.js) and
// the ScriptProcessor path (ws-transport.js): rate conversion between the AudioContext's
// rate and the wire's 24 kHz, a bounded playback queue, pcm16 <-> base64.
//
// Linear interpolation with a one-pole low-pass in front when going down: speech through
// it stays intelligible; the WebRTC path (Opus, the browser's own resampler) is the one
// tuned for quality.

export const WIRE_RATE = 24000;

export class LinearResampler {
  constructor(fromRate, toRate) {
    this.step = fromRate / toRate;  // input samples per output sample
    this.pos = 0;  // position of the next output sample, relative to `last`
    this.last = 0;  // the previous call's final input sample (index -1)
    this.smoothing = fromRate > toRate ? toRate / fromRate : 1;  // low-pass only when decimating
    this.lowpassed = 0;
  }

  process(input) {
    const src = this.smoothing < 1 ? this.lowpass(input) : input;
    // One spare slot: the count is computed in floating point, the loop is bounded by `pos`
    // alone, so `pos` always ends at or past the chunk (never reading before the next one).
    const out = new Float32Array(Math.max(0, Math.ceil((src.length - this.pos) / this.step)) + 1);
    let n = 0;
    let pos = this.pos;
    while (pos < src.length) {
      const i = Math.floor(pos);
      const frac = pos - i;
      const a = i === 0 ? this.last : src[i - 1];
      out[n++] = a + (src[i] - a) * frac;
      pos += this.step;
    }
    this.pos = pos - src.length;
    if (src.length) this.last = src[src.length - 1];
    return out.subarray(0, n);
  }

  lowpass(input) {
    const out = new Float32Array(input.length);
    let y = this.lowpassed;
    for (let i = 0; i < input.length; i++) {
      y += this.smoothing * (input[i] - y);
      out[i] = y;
    }
    this.lowpassed = y;
    return out;
  }
}

// Agent audio waiting to be played, bounded: past `maxSamples` the oldest is dropped
// (a stalled tab must not grow memory; the server paces audio at real time anyway).
export class PlaybackQueue {
  constructor(maxSamples) {
    this.maxSamples = maxSamples;
    this.chunks = [];
    this.offset = 0;  // samples of chunks[0] already played
    this.queued = 0;
    this.played = 0;  // samples played so far (silence fill not counted)
    this.energy = 0;  // sum of squares of the samples played
    this.dropped = 0;
  }

  push(samples) {
    this.chunks.push(samples);
    this.queued += samples.length;
    while (this.queued > this.maxSamples && this.chunks.length > 1) {
      const first = this.chunks.shift();
      this.dropped += first.length - this.offset;
      this.queued -= first.length - this.offset;
      this.offset = 0;
    }
  }

  clear() {
    this.chunks = [];
    this.offset = 0;
    this.queued = 0;
  }

  // Fills `out` from the queue, zeros after it runs out.
  pull(out) {
    let n = 0;
    while (n < out.length && this.chunks.length) {
      const head = this.chunks[0];
      const take = Math.min(out.length - n, head.length - this.offset);
      for (let i = 0; i < take; i++) {
        const v = head[this.offset + i];
        out[n + i] = v;
        this.energy += v * v;
      }
      n += take;
      this.offset += take;
      if (this.offset === head.length) {
        this.chunks.shift();
        this.offset = 0;
      }
    }
    this.queued -= n;
    this.played += n;
    out.fill(0, n);
  }
}

export function floatToPcm16Base64(samples) {
  const bytes = new Uint8Array(samples.length * 2);
  const view = new DataView(bytes.buffer);
  for (let i = 0; i < samples.length; i++) {
    const s = Math.max(-1, Math.min(1, samples[i]));
    view.setInt16(i * 2, s < 0 ? s * 0x8000 : s * 0x7fff, true);
  }
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

export function pcm16Base64ToFloat(b64) {
  const binary = atob(b64);
  const count = binary.length >> 1;
  const out = new Float32Array(count);
  for (let i = 0; i < count; i++) {
    const lo = binary.charCodeAt(2 * i);
    const hi = binary.charCodeAt(2 * i + 1);
    const v = (hi << 8) | lo;
    out[i] = (v >= 0x8000 ? v - 0x10000 : v) / 0x8000;
  }
  return out;
}
