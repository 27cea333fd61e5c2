// Sign-in with an OpenID Connect provider: the authorization code flow
// with PKCE (RFC 7636), the console a public client. The access token is
// asked for txgate's audience (RFC 8707 `resource`), kept in this tab's
// sessionStorage (never in a URL, never in localStorage) and refreshed
// before it expires; the ID token is never sent to the gateway. Only the
// issuers the gateway lists (GET /console/config.json) are contacted, and
// the console's Content-Security-Policy allows their origins and no other.

const PENDING = "txgate-console-oidc-pending";
const SESSION = "txgate-console-oidc";

function b64url(bytes) {
  let text = "";
  for (const b of new Uint8Array(bytes)) text += String.fromCharCode(b);
  return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

const random = (n) => b64url(crypto.getRandomValues(new Uint8Array(n)));

async function discover(issuer) {
  const res = await fetch(`${issuer.url.replace(/\/$/, "")}/.well-known/openid-configuration`);
  if (!res.ok) throw new Error(`the provider's discovery answered ${res.status}`);
  const doc = await res.json();
  if (doc.issuer !== issuer.url) throw new Error("the provider's discovery names another issuer");
  return doc;
}

const redirectUri = () => `${location.origin}/console`;

/** The issuers the console may sign in with. */
export async function issuers() {
  const res = await fetch("/console/config.json");
  if (!res.ok) return [];
  return (await res.json()).issuers || [];
}

/** Go to `issuer`'s sign-in page. */
export async function begin(issuer) {
  const doc = await discover(issuer);
  const verifier = random(32);
  const state = random(16);
  const challenge = b64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
  sessionStorage.setItem(PENDING, JSON.stringify({ issuer, verifier, state, hash: location.hash }));
  const q = new URLSearchParams({
    response_type: "code",
    client_id: issuer.client_id,
    redirect_uri: redirectUri(),
    scope: "openid offline_access",
    prompt: "consent",
    code_challenge: challenge,
    code_challenge_method: "S256",
    state,
    resource: issuer.audience,
  });
  // The endpoint may carry a query of its own (`?p=<policy>`).
  const url = new URL(doc.authorization_endpoint);
  for (const [k, v] of q) url.searchParams.set(k, v);
  location.assign(url.toString());
}

async function tokens(issuer, form) {
  const doc = await discover(issuer);
  const res = await fetch(doc.token_endpoint, {
    method: "POST",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({ client_id: issuer.client_id, resource: issuer.audience, ...form }),
  });
  const body = await res.json().catch(() => ({}));
  if (!res.ok || typeof body.access_token !== "string") {
    throw new Error(`the provider refused: ${body.error_description || body.error || res.status}`);
  }
  return body;
}

/**
 * Back from the provider (`?code=…&state=…`): the code for tokens; the
 * code and state leave the address bar at once. Returns the access token,
 * or null when this load is not a return from sign-in.
 */
export async function complete(store) {
  const params = new URLSearchParams(location.search);
  const code = params.get("code");
  const error = params.get("error");
  if (!code && !error) return null;
  const pending = JSON.parse(sessionStorage.getItem(PENDING) || "null");
  // Only the answer to this tab's own sign-in is taken (its `state`), and
  // only from the issuer it went to (RFC 9207 `iss`, when sent).
  const ours = pending && params.get("state") === pending.state &&
    (!params.has("iss") || params.get("iss") === pending.issuer.url);
  history.replaceState(null, "", `/console${ours ? pending.hash || "" : ""}`);
  if (!ours) return null;
  sessionStorage.removeItem(PENDING);
  // The provider's own words are not shown as the console's.
  if (error) throw new Error(`sign-in with ${pending.issuer.name} did not complete (${error})`);
  sessionStorage.removeItem(SESSION);
  const body = await tokens(pending.issuer, {
    grant_type: "authorization_code",
    code,
    redirect_uri: redirectUri(),
    code_verifier: pending.verifier,
  });
  keep(pending.issuer, body, store);
  return body.access_token;
}

function keep(issuer, body, store) {
  const expiresAt = Date.now() + 1000 * Number(body.expires_in || 300);
  // A provider that does not rotate refresh tokens sends none again.
  const before = JSON.parse(sessionStorage.getItem(SESSION) || "null");
  const refresh = body.refresh_token || before?.refresh || null;
  sessionStorage.setItem(SESSION, JSON.stringify({ issuer, refresh, expiresAt }));
  store(body.access_token);
}

let timer = null;

/**
 * Keep the session's token fresh: refreshed a little before it expires;
 * `onLost` is called when it cannot be (the user signs in again).
 */
export function keepFresh(store, onLost) {
  clearTimeout(timer);
  const session = JSON.parse(sessionStorage.getItem(SESSION) || "null");
  if (!session) return;
  const wait = Math.max(1000, session.expiresAt - Date.now() - 30_000);
  timer = setTimeout(async () => {
    try {
      if (!session.refresh) throw new Error("no refresh token");
      const body = await tokens(session.issuer, { grant_type: "refresh_token", refresh_token: session.refresh });
      keep(session.issuer, body, store);
      keepFresh(store, onLost);
    } catch {
      onLost();
    }
  }, wait);
}

/** Forget the session. */
export function end() {
  clearTimeout(timer);
  sessionStorage.removeItem(SESSION);
  sessionStorage.removeItem(PENDING);
}
