"""Audio codecs and conversions: PCM, resampling, G.711, Opus, Ogg-Opus, WAV."""
