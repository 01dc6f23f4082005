// The key a call is placed with. The page's key field may hold:
// * nothing: the server has no API key;
// * an ephemeral key (ek_...) minted by someone else's backend: used as it is;
// * the server's API key: exchanged here for a short-lived ek_ key bound to calls, as
//   OpenAI's browser flow does, so the call itself never carries the server key.
import { errorFromResponse } from "./transport-errors.js";

const SECRETS_URL = "/v1/realtime/client_secrets";

export function isEphemeral(key) {
  return key.startsWith("ek_");
}

export async function callKey(key) {
  if (!key || isEphemeral(key)) return key || null;
  const response = await fetch(SECRETS_URL, {
    method: "POST",
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: JSON.stringify({ session: { type: "realtime" } }),
  });
  // No such route (a server without WebRTC): the WebSocket fallback takes the key as it is.
  if (!response.ok) throw await errorFromResponse(response, "minting an ephemeral key", { fallbackStatuses: [404, 405] });
  const body = await response.json();
  return body.value;
}
