"""Every vLLM route behind the API key, except ``/health``: an ASGI middleware for ``vllm serve``.

vLLM's own ``VLLM_API_KEY`` check (AuthenticationMiddleware) guards only the paths that start with
/v1, /v2, /inference and /cohere: with the key set, ``POST /invocations`` still answers a full
completion and /tokenize, /metrics, /version, /load, /scale_elastic_ep ... answer anyone. This
middleware denies by default instead: a request passes only with ``Authorization: Bearer <key>``,
whatever its path, method (HEAD and OPTIONS included) or scope type (websockets too), and whether
or not a route exists. Two exceptions:

- ``/health`` (any method): systemd's start-up check and the health timer's liveness probe, which
  carries no secret; it says only "up" or "engine dead".
- ``/metrics`` (vLLM mounts the Prometheus app at every path starting with /metrics): also open to
  clients whose address is in ``QWEN27B_METRICS_ALLOW`` (comma-separated networks, e.g.
  ``10.0.0.5/32``), so a Prometheus scraper needs no API key. Only a request without proxy
  headers (``X-Forwarded-For``, ``Forwarded``) gets this: uvicorn trusts ``X-Forwarded-For`` from
  127.0.0.1 and ::1 (its ``FORWARDED_ALLOW_IPS`` default) and puts the claimed address into the
  scope's client before this guard sees it, so any loopback user could claim the scraper's
  address. A scraper talks to vLLM directly; a proxy in front (the gateway) sends the key.

Why a middleware and not nginx in front with vLLM on loopback: one process and no extra package on
the host; the route table stays vLLM's own, so a route a future vLLM adds is covered by the default
deny instead of by a proxy config someone must remember to extend; and vLLM's ``--middleware``
hook (``app.add_middleware``, the last one added, so outside vLLM's own middleware) is a
supported flag. TLS is then vLLM's ``--ssl-keyfile/--ssl-certfile`` (see docs/security.md).

Deployed with the rest of the package as ``<release venv>/lib/qwen27b_onhost/route_auth.py`` (pure
stdlib: it must import in vLLM's venv), that directory on the unit's PYTHONPATH and
``--middleware qwen27b_onhost.route_auth.RequireKey`` (contract.MIDDLEWARE). The
key comes from VLLM_API_KEY (the unit's 0600 env file); without one it refuses to start: a
guard that silently guards nothing is worse than a service that does not come up.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os

OPEN_PATHS = ("/health",)
METRICS_PREFIX = "/metrics"
PROXY_HEADERS = (b"x-forwarded-for", b"forwarded")
DENIED_ERROR = "Unauthorized"  # the 401 body's "error": doctor tells a guarded /metrics by it
_DENIED = json.dumps({"error": DENIED_ERROR, "detail": "send Authorization: Bearer <API key>"}).encode()


def parse_networks(text: str) -> list:
    """``QWEN27B_METRICS_ALLOW``'s networks; a bad entry raises ValueError naming it."""
    networks = []
    for item in text.replace(",", " ").split():
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"QWEN27B_METRICS_ALLOW: {item!r} is not a network (e.g. 10.0.0.5/32)") from None
    return networks


def _digest(value: bytes) -> bytes:
    # compare hashes: compare_digest on the raw values would leak the key's length
    return hashlib.sha256(value).digest()


class RequireKey:
    """ASGI middleware: 401 (websocket: close before accept, which the server sends as 403)
    unless the request carries the key; /health always passes, /metrics for allowed addresses."""

    def __init__(self, app, api_key: str | None = None, metrics_allow: str | None = None):
        self.app = app
        key = api_key if api_key is not None else os.environ.get("VLLM_API_KEY", "")
        if not key:
            raise RuntimeError("qwen27b_auth.RequireKey: VLLM_API_KEY is empty; refusing to serve unguarded")
        self._key = _digest(key.encode())
        allow = metrics_allow if metrics_allow is not None else os.environ.get("QWEN27B_METRICS_ALLOW", "")
        self.metrics_allow = parse_networks(allow)

    def _has_key(self, scope) -> bool:
        for name, value in scope.get("headers") or []:
            if name.lower() == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(_digest(token.strip()), self._key)
        return False

    def _scraper(self, scope) -> bool:
        client = scope.get("client")
        if not (client and self.metrics_allow):
            return False
        if any(name.lower() in PROXY_HEADERS for name, _ in scope.get("headers") or []):
            return False  # the client may be what the header claims (uvicorn's proxy headers)
        try:
            address = ipaddress.ip_address(client[0])
        except ValueError:
            return False
        address = getattr(address, "ipv4_mapped", None) or address
        return any(address in network for network in self.metrics_allow)

    def allowed(self, scope) -> bool:
        root = scope.get("root_path", "")
        path = scope.get("path", "")
        path = path[len(root):] if root and path.startswith(root) else path
        if path in OPEN_PATHS:
            return True
        if path.startswith(METRICS_PREFIX) and self._scraper(scope):
            return True
        return self._has_key(scope)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self.allowed(scope):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(_DENIED)).encode())]})
        await send({"type": "http.response.body", "body": _DENIED})
