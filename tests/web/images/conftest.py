from tests.engines.diffusion.tiny_pipeline import one_torch_thread, tiny_sd_folder  # noqa: F401  # fixtures
