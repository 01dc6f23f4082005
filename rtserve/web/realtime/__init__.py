"""OpenAI Realtime and native duplex protocol: ``WS /v1/realtime`` and ``WS /v1/duplex``
(routes in ``routes.py``; kept import-free so ``errors`` loads without the routes)."""
