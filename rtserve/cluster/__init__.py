"""Engines as Ray actors on a cluster (``rtserve serve --ray-address ADDR``).

Ray places the engine processes (one actor per accelerator, or per CPU engine), restarts
one that dies and names them so any front-end finds them; the frames themselves keep
crossing the engine link of ``engines/remote`` in per-tick batches per front-end, over TCP
with a shared-secret handshake before any pickle is read. Nothing here is imported unless
``cluster.address`` is set.
"""
