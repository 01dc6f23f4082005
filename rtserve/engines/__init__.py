"""Engines: the lockstep runtime, stage pipelines and concrete engines. No aiohttp here."""
