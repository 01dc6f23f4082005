"""Robot policies served over the openpi protocol: the built-in ``demo`` DROID policy,
user policies (``module:factory`` or a TorchScript file) and the batching engine thread."""
