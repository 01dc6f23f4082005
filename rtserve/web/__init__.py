"""Transports: one subpackage per protocol (aiohttp routes, WebSocket protocols) over shared
connection helpers and one codec executor. Speaks typed commands/events only."""
