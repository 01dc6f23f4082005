// AudioWorklet processors of the WebSocket fallback. They run on the audio thread;
// `sampleRate` is the AudioContext's rate (a global of this scope).
import { LinearResampler, PlaybackQueue, WIRE_RATE } from "./pcm-stream.js";

const CAPTURE_CHUNK = WIRE_RATE / 50;  // 20 ms at 24 kHz per message to the page
const STATS_EVERY = Math.round(sampleRate / 128 / 4);  // about 4 times a second (128-sample quanta)

// Microphone -> 24 kHz mono chunks posted to the page.
class PcmCapture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.resampler = new LinearResampler(sampleRate, WIRE_RATE);
    this.pending = new Float32Array(CAPTURE_CHUNK);
    this.filled = 0;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    const converted = this.resampler.process(channel);
    let offset = 0;
    while (offset < converted.length) {
      const take = Math.min(CAPTURE_CHUNK - this.filled, converted.length - offset);
      this.pending.set(converted.subarray(offset, offset + take), this.filled);
      this.filled += take;
      offset += take;
      if (this.filled === CAPTURE_CHUNK) {
        this.port.postMessage(this.pending);
        this.pending = new Float32Array(CAPTURE_CHUNK);
        this.filled = 0;
      }
    }
    return true;
  }
}

// 24 kHz agent audio from the page -> speakers, with played-sample counts posted back.
class PcmPlayer extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const maxSeconds = (options.processorOptions && options.processorOptions.maxQueueSeconds) || 30;
    this.queue = new PlaybackQueue(Math.round(maxSeconds * sampleRate));
    this.resampler = new LinearResampler(WIRE_RATE, sampleRate);
    this.quanta = 0;
    this.port.onmessage = (e) => {
      if (e.data === "clear") {
        this.queue.clear();
      } else {
        this.queue.push(sampleRate === WIRE_RATE ? e.data : this.resampler.process(e.data));
      }
    };
  }

  process(inputs, outputs) {
    const out = outputs[0];
    this.queue.pull(out[0]);
    for (let c = 1; c < out.length; c++) out[c].set(out[0]);
    if (++this.quanta % STATS_EVERY === 0) {
      const q = this.queue;
      this.port.postMessage({ played: q.played, energy: q.energy, queued: q.queued, dropped: q.dropped,
                              rate: sampleRate });
    }
    return true;
  }
}

registerProcessor("pcm-capture", PcmCapture);
registerProcessor("pcm-player", PcmPlayer);
