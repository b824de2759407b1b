// Calls to the node's REST API (/api/v1), with the admin token.
//
// The node trusts clients on loopback; any other client sends
// `Authorization: Bearer <token>`, the content of DATA/admin.token of any
// node. The page keeps the token in sessionStorage (gone when the tab
// closes, never sent anywhere but this node) and sends it on every call.

const TOKEN_KEY = 'trireme.adminToken';
/** A node that does not answer in this time is reported as unreachable. */
const TIMEOUT_MS = 8000;

export class ApiError extends Error {
  constructor(status, code, message, tokenSent = false) {
    super(message);
    this.status = status;
    this.code = code;
    /** The request carried a token (so a 401 means it was refused). */
    this.tokenSent = tokenSent;
  }

  /** 401/403: the node wants a (valid) admin token. */
  get unauthorized() {
    return this.status === 401 || this.status === 403;
  }

  /** The node has no such endpoint (an older version): not an error of the page. */
  get endpointMissing() {
    return this.status === 404 && this.code === 'unknown_endpoint';
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value) {
  sessionStorage.setItem(TOKEN_KEY, value.trim());
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

const unauthorizedListeners = [];

/** Called with the ApiError of every 401/403 answer. */
export function onUnauthorized(listener) {
  unauthorizedListeners.push(listener);
}

/** One API call; resolves to the parsed JSON (null for 204), throws ApiError. */
export async function call(method, path, body) {
  return (await request(method, path, body)).json;
}

/** One API call; resolves to {status, json}: 202 says "still under way". */
async function request(method, path, body) {
  const headers = { Accept: 'application/json' };
  const current = token();
  if (current) headers.Authorization = `Bearer ${current}`;
  // Every change says it is JSON, body or not: a node refuses changes
  // sent as a form or text/plain, which another site could make a browser
  // send (docs/dashboard.md).
  if (method !== 'GET') headers['Content-Type'] = 'application/json';
  const abort = new AbortController();
  // Changes may take long (a resync to wait for); reads must not hang a poll.
  const timer = method === 'GET' ? setTimeout(() => abort.abort(), TIMEOUT_MS) : null;
  let response;
  try {
    response = await fetch(`/api/v1${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
      signal: abort.signal,
    });
  } catch (failure) {
    throw new ApiError(
      0,
      'unreachable',
      `cannot reach the node at ${location.host} (${failure.name === 'AbortError' ? 'no answer in time' : failure.message}): is trireme node run still running there?`,
    );
  } finally {
    if (timer) clearTimeout(timer);
  }
  const text = await response.text();
  let json = null;
  try {
    json = text.trim() ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  if (response.ok) return { status: response.status, json };
  const error = new ApiError(
    response.status,
    json?.code ?? `http_${response.status}`,
    json?.error ?? `the node answered ${response.status}: ${text.slice(0, 200)}`,
    Boolean(current),
  );
  if (error.unauthorized) unauthorizedListeners.forEach((listener) => listener(error));
  throw error;
}

export const get = (path) => call('GET', path);
export const post = (path, body = {}) => call('POST', path, body);
export const put = (path, body) => call('PUT', path, body);
/** A delete: resolves to {status, json} (204 done, 202 under way). */
export const del = (path) => request('DELETE', path);

/** A path segment: names are validated by the node, but never trusted here. */
export const segment = (name) => encodeURIComponent(name);
