// The conversation as the server's events tell it: user turns from the input transcription
// events, agent turns from the output transcript (or text) events, one entry per item.
// Bounded: the oldest entries go past MAX_ENTRIES, and a never-ending answer (a duplex
// model's one continuous response) keeps only its last MAX_CHARS characters.

const MAX_ENTRIES = 200;
const MAX_CHARS = 4000;

export class Transcript {
  constructor(list) {
    this.list = list;
    this.entries = new Map();  // item_id -> {li, text}
  }

  clear() {
    this.list.replaceChildren();
    this.entries.clear();
  }

  entry(itemId, who) {
    let entry = this.entries.get(itemId);
    if (!entry) {
      const li = document.createElement("li");
      li.className = `turn ${who}`;
      li.dataset.item = itemId;
      const label = document.createElement("span");
      label.className = "who";
      label.textContent = who === "user" ? "you" : "agent";
      const text = document.createElement("span");
      text.className = "text";
      li.append(label, text);
      this.list.append(li);
      entry = { li, text, value: "" };
      this.entries.set(itemId, entry);
      while (this.entries.size > MAX_ENTRIES) {
        const [oldest, old] = this.entries.entries().next().value;
        old.li.remove();
        this.entries.delete(oldest);
      }
    }
    return entry;
  }

  set(itemId, who, value, { final = false } = {}) {
    if (!value && !this.entries.has(itemId)) return;  // an answer cut off before it said anything
    const entry = this.entry(itemId, who);
    entry.value = value.length > MAX_CHARS ? "\u2026" + value.slice(-MAX_CHARS) : value;
    entry.text.textContent = entry.value;
    entry.li.classList.toggle("partial", !final);
    this.list.scrollTop = this.list.scrollHeight;
  }

  append(itemId, who, delta) {
    if (!delta) return;
    this.set(itemId, who, this.entry(itemId, who).value + delta);
  }

  text(who) {
    return [...this.entries.values()].filter((e) => e.li.classList.contains(who)).map((e) => e.value).join(" ");
  }

  mark(itemId, state) {
    const entry = this.entries.get(itemId);
    if (entry) entry.li.classList.add(state);
  }

  // Applies one server event; returns true if it concerned the conversation.
  apply(event) {
    switch (event.type) {
      case "conversation.item.input_audio_transcription.delta":
        this.append(event.item_id, "user", event.delta);
        return true;
      case "conversation.item.input_audio_transcription.completed":
        this.set(event.item_id, "user", event.transcript || "", { final: true });
        return true;
      case "response.output_audio_transcript.delta":
      case "response.output_text.delta":
        this.append(event.item_id, "agent", event.delta);
        return true;
      case "response.output_audio_transcript.done":
        this.set(event.item_id, "agent", event.transcript || "", { final: true });
        return true;
      case "response.output_text.done":
        this.set(event.item_id, "agent", event.text || "", { final: true });
        return true;
      case "response.done":
        for (const item of (event.response && event.response.output) || []) {
          if (event.response.status === "cancelled") this.mark(item.id, "interrupted");
        }
        return true;
      default:
        return false;
    }
  }
}
