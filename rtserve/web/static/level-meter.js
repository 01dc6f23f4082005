// Audio level of a node, read on demand: RMS of the latest analyser window, in dBFS.

const FLOOR_DB = -60;

export class LevelMeter {
  constructor(audio, source) {
    this.analyser = audio.createAnalyser();
    this.analyser.fftSize = 1024;
    this.samples = new Float32Array(this.analyser.fftSize);
    source.connect(this.analyser);
  }

  // dBFS, at least FLOOR_DB (silence)
  read() {
    this.analyser.getFloatTimeDomainData(this.samples);
    let sum = 0;
    for (const v of this.samples) sum += v * v;
    const rms = Math.sqrt(sum / this.samples.length);
    return Math.max(FLOOR_DB, 20 * Math.log10(rms || 1e-9));
  }

  // 0..1 for a bar
  static fraction(db) {
    return (db - FLOOR_DB) / -FLOOR_DB;
  }

  disconnect() {
    this.analyser.disconnect();
  }
}
