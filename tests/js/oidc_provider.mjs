// A real OIDC issuer for the identity tests (tests/e2e/oidc.py): oidc-provider, configured from
// the JSON file named by argv[2], issuing JWT access tokens with client credentials, and to
// public clients (a browser page) by authorization code + PKCE through its own login page.
//
// The config: {"port", "keys_file", "clients": [{"client_id", "client_secret", "ttl"?,
// "claims"?} | {"client_id", "redirect_uris", "ttl"?, "claims"?} (a public client: no secret,
// PKCE required, refresh tokens with `offline_access`)], "resource"}. keys_file holds a private JWKS; POST /__rotate reads it again and
// swaps in a provider signing with its first key, so a test can rotate keys mid-run.
import fs from 'node:fs';
import http from 'node:http';
import Provider from 'oidc-provider';

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const issuer = `http://127.0.0.1:${config.port}`;
const byClient = new Map(config.clients.map((c) => [c.client_id, c]));

function build() {
  const keys = JSON.parse(fs.readFileSync(config.keys_file, 'utf8')).keys;
  const provider = new Provider(issuer, {
    jwks: { keys },
    clients: config.clients.map((c) =>
      c.redirect_uris
        ? {
            client_id: c.client_id,
            token_endpoint_auth_method: 'none',
            grant_types: ['authorization_code', 'refresh_token'],
            redirect_uris: c.redirect_uris,
            response_types: ['code'],
            scope: 'openid offline_access threadline',
          }
        : {
            client_id: c.client_id,
            client_secret: c.client_secret,
            grant_types: ['client_credentials'],
            redirect_uris: [],
            response_types: [],
            scope: 'threadline',
          },
    ),
    scopes: ['openid', 'offline_access', 'threadline'],
    // PKCE is required of public clients by default; S256 is the only method offered.
    pkce: { required: () => true },
    // The login form of devInteractions accepts any login: the account id is what was typed.
    findAccount: (ctx, id) => ({ accountId: id, claims: () => ({ sub: id }) }),
    features: {
      devInteractions: { enabled: config.clients.some((c) => c.redirect_uris) },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => config.resource,
        useGrantedResource: () => true,
        getResourceServerInfo: (ctx, resource, client) => ({
          scope: 'threadline',
          audience: resource,
          accessTokenTTL: byClient.get(client.clientId)?.ttl ?? 600,
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: keys[0].alg ?? 'RS256' } },
        }),
      },
    },
    extraTokenClaims: (ctx, token) => byClient.get(token.clientId)?.claims ?? {},
    // Every refresh answers with a new refresh token, and the page keeps the newest.
    rotateRefreshToken: true,
  });
  provider.on('server_error', (ctx, err) => console.error('server_error', err));
  return provider.callback();
}

let handler = build();
const server = http.createServer((req, res) => {
  if (req.method === 'POST' && req.url === '/__rotate') {
    handler = build();
    res.writeHead(204).end();
    return;
  }
  handler(req, res);
});
server.listen(config.port, '127.0.0.1', () => console.log(`ready ${issuer}`));
process.on('SIGTERM', () => server.close(() => process.exit(0)));
