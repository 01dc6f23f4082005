// The settings form <-> a GA `session.update`. Remembered in this browser (localStorage),
// except the API key, which the page never stores.

const STORE = "rtserve.settings";
const FIELDS = ["instructions", "voice", "turn_detection", "threshold", "silence_duration_ms", "transport",
                "echo_cancellation"];

export class Settings {
  constructor(form) {
    this.form = form;
    this.restore();
    form.addEventListener("change", () => this.save());
  }

  value(name) {
    const field = this.form.elements[name];
    return field.type === "checkbox" ? field.checked : field.value;
  }

  restore() {
    let saved = {};
    try {
      saved = JSON.parse(localStorage.getItem(STORE) || "{}");
    } catch (_) {
      return;  // storage off or garbled: the form's defaults
    }
    for (const name of FIELDS) {
      if (!(name in saved)) continue;
      const field = this.form.elements[name];
      if (field.type === "checkbox") field.checked = Boolean(saved[name]); else field.value = saved[name];
    }
  }

  save() {
    const values = Object.fromEntries(FIELDS.map((name) => [name, this.value(name)]));
    try {
      localStorage.setItem(STORE, JSON.stringify(values));
    } catch (_) {
      // storage off: settings last for this page only
    }
  }

  // What the server should change: only the fields the user set.
  sessionUpdate() {
    const session = { type: "realtime" };
    const audio = {};
    const instructions = this.value("instructions").trim();
    if (instructions) session.instructions = instructions;
    const voice = this.value("voice").trim();
    if (voice) audio.output = { voice };
    const detection = this.value("turn_detection");
    if (detection === "server_vad") {
      audio.input = { turn_detection: { type: "server_vad", threshold: Number(this.value("threshold")),
                                        silence_duration_ms: Number(this.value("silence_duration_ms")) } };
    } else if (detection === "none") {
      audio.input = { turn_detection: null };
    }
    if (Object.keys(audio).length) session.audio = audio;
    return { type: "session.update", session };
  }

  // What the server said it is running with (session.created / session.updated).
  showSession(session) {
    const detection = session.audio && session.audio.input && session.audio.input.turn_detection;
    const placeholder = detection ? `server VAD (${detection.silence_duration_ms} ms)` : "off";
    this.form.elements.turn_detection.options[0].textContent = `as the server starts it: ${placeholder}`;
    const voice = session.audio && session.audio.output && session.audio.output.voice;
    if (voice) this.form.elements.voice.placeholder = voice;
  }

  microphoneConstraints() {
    const processing = this.value("echo_cancellation");
    return { audio: { echoCancellation: processing, noiseSuppression: processing, autoGainControl: processing,
                      channelCount: 1 } };
  }
}
