"""Transports: aiohttp routes, WebSocket protocols, WebRTC. Speaks typed commands/events only."""
