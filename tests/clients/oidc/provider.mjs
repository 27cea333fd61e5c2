// A real OpenID Connect provider (panva's oidc-provider, pinned in
// package-lock.json) for txgate's client tests: discovery, a JWKS, the
// authorization code flow with PKCE behind its own login and consent pages
// (devInteractions), client credentials, and JWT access tokens for
// txgate's audience (RFC 8707 resource indicators).
//
//   node provider.mjs <port> <keys.json> <console-redirect-uri>
//
// keys.json holds the private JWKs to sign with (the first RS256 one
// signs); the test restarts the provider with other keys to rotate them.
// Users' roles: ann → shopper, sam → support, anyone else → none.
import fs from "node:fs";
import Provider from "oidc-provider";

const [port, keysFile, redirect] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;
const keys = JSON.parse(fs.readFileSync(keysFile, "utf8"));
const roles = { ann: ["shopper"], sam: ["support"], backend: ["shopper"] };
const ttl = Number(process.env.ACCESS_TOKEN_TTL || 300);

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: "txgate-console",
      token_endpoint_auth_method: "none",
      application_type: "native",
      redirect_uris: [redirect],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
    },
    {
      client_id: "backend",
      client_secret: "backend-secret-0123456789",
      grant_types: ["client_credentials"],
      redirect_uris: [],
      response_types: [],
    },
  ],
  jwks: { keys },
  findAccount: (ctx, id) => ({ accountId: id, claims: () => ({ sub: id, name: id }) }),
  features: {
    devInteractions: { enabled: true },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => "urn:txgate:api",
      useGrantedResource: () => true,
      getResourceServerInfo: () => ({
        scope: "openid",
        audience: "urn:txgate:api",
        accessTokenFormat: "jwt",
        accessTokenTTL: ttl,
        jwt: { sign: { alg: "RS256" } },
      }),
    },
  },
  extraTokenClaims: (ctx, token) => {
    const who = token.accountId || token.clientId;
    return { realm_access: { roles: roles[who] || [] } };
  },
  pkce: { required: () => true },
  clientBasedCORS: () => true,
  ttl: { AccessToken: ttl, Session: 3600, Grant: 3600, Interaction: 600 },
});
provider.listen(Number(port), "127.0.0.1", () => {
  console.log(`provider ready at ${issuer}`);
});
