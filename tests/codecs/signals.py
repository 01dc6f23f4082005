"""Test signals and comparison helpers shared by the codec tests."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def speechlike(rate: int, seconds: float, seed: int = 0) -> np.ndarray:
    """A voiced-speech stand-in: gliding 110-185 Hz harmonics, syllable-rate envelope, a
    little noise. Not periodic, so cross-correlation finds one unambiguous lag."""
    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    t = np.arange(n) / rate
    f0 = 140 + 30 * np.sin(2 * np.pi * 1.3 * t) + 15 * np.sin(2 * np.pi * 0.37 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    harmonics = [k for k in range(1, 25) if k * f0.max() < 0.45 * rate]
    x = sum((0.6 / k) * np.sin(k * phase) for k in harmonics)
    x = x * (0.5 + 0.5 * np.sin(2 * np.pi * 3.1 * t) ** 2) + 0.01 * rng.standard_normal(n)
    return (0.3 * x / np.max(np.abs(x))).astype(np.float32)


def best_lag(reference: np.ndarray, signal: np.ndarray, max_lag: int) -> int:
    """Lag L (|L| < max_lag) maximising correlation of ``signal[L + i]`` with ``reference[i]``."""
    size = 1 << int(np.ceil(np.log2(len(reference) + len(signal))))
    corr = np.fft.irfft(np.fft.rfft(signal, size) * np.conj(np.fft.rfft(reference, size)), size)
    lags = np.r_[np.arange(0, max_lag), np.arange(-max_lag + 1, 0)]
    values = np.r_[corr[:max_lag], corr[size - max_lag + 1 :]]
    return int(lags[np.argmax(values)])


def overlap(reference: np.ndarray, signal: np.ndarray, lag: int) -> tuple[np.ndarray, np.ndarray]:
    if lag >= 0:
        n = min(len(reference), len(signal) - lag)
        return reference[:n], signal[lag : lag + n]
    n = min(len(reference) + lag, len(signal))
    return reference[-lag : -lag + n], signal[:n]


def snr_db(reference: np.ndarray, signal: np.ndarray, lag: int = 0) -> float:
    ref, sig = overlap(np.asarray(reference, np.float64), np.asarray(signal, np.float64), lag)
    noise = np.sum((ref - sig) ** 2)
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(ref**2) / noise))


def correlation(reference: np.ndarray, signal: np.ndarray, lag: int = 0) -> float:
    ref, sig = overlap(np.asarray(reference, np.float64), np.asarray(signal, np.float64), lag)
    return float(np.dot(ref, sig) / np.sqrt(np.dot(ref, ref) * np.dot(sig, sig)))


def irregular_chunks(data, seed: int, max_size: int = 700) -> Iterator:
    """Split bytes or an array into random-sized pieces (1..max_size)."""
    rng = np.random.default_rng(seed)
    start = 0
    while start < len(data):
        size = int(rng.integers(1, max_size + 1))
        yield data[start : start + size]
        start += size
