// Why a connection attempt failed, as the page needs to know it: whether trying the other
// transport could help (`fallback`), and the server's error code when it gave one.

export class ConnectError extends Error {
  constructor(message, { code = null, status = null, fallback = false } = {}) {
    super(message);
    this.name = "ConnectError";
    this.code = code;  // the server's error code (resource_exhausted, invalid_api_key, ...)
    this.status = status;  // HTTP status, when the answer was HTTP
    this.fallback = fallback;  // true: this transport cannot work here; the other one may
  }

  get serverFull() {
    return this.code === "resource_exhausted" || this.status === 429;
  }

  get keyRejected() {
    return this.code === "invalid_api_key" || this.status === 401;
  }
}

// An OpenAI-shaped error body ({"error": {"code", "message"}}) -> ConnectError.
export async function errorFromResponse(response, what, { fallbackStatuses = [] } = {}) {
  let code = null;
  let message = `${what} answered HTTP ${response.status}`;
  try {
    const body = await response.json();
    if (body && body.error) {
      code = body.error.code || null;
      if (body.error.message) message = `${what}: ${body.error.message}`;
    }
  } catch (_) {
    // Not JSON (a proxy's page, say): the status line is all there is to say.
  }
  return new ConnectError(message, { code, status: response.status,
                                     fallback: fallbackStatuses.includes(response.status) });
}
