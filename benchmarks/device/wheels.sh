#!/usr/bin/env bash
# Here, once per checkout: the CPython 3.12 wheels the H200 host lacks (its image has torch, numpy,
# aiohttp, msgpack, prometheus-client, pyyaml, onnxruntime, transformers), in ignored folders a
# device call carries. A call carries at most 64 MiB (the tree included), so they come in four sets:
#   benchmarks/results/device/whl   ~46 MiB  rtserve's runtime needs and moshi (the parity oracle)
#   benchmarks/results/device/whlx   ~9 MiB  pytest and the test plugins, py-spy (--profile-engine), llguidance
#   benchmarks/results/device/whls  ~18 MiB  sphn (bench_moshi's Opus clients), carried in a later call
#   benchmarks/results/device/whlt  ~5.5 MiB transformers and tokenizers as pyproject.toml pins them (the
#                                            image's transformers refuses huggingface_hub 2.x): the
#                                            cascade's in-process LLM (bench_voice_agent.py --llm in-process);
#                                            transformers with the Llama family's models only
#                                            (slim_transformers.py), so whl, whlt and the voice agent's
#                                            kit fit one call
# On the device: `. benchmarks/device/setup.sh` at the start of every call (benchmarks/device/README.md).
set -euo pipefail
. "$(dirname "$0")/download.sh"
rm -rf "$D/whl" "$D/whlx" "$D/whls" "$D/whlt"
$PIP -d "$D/whl" "websockets>=13" "aiortc>=1.9" "av>=13" "soxr>=0.5" "pydantic>=2.7,<3" huggingface_hub==2.4.0
$PIP --no-deps -d "$D/whl" moshi==0.2.13
$PIP -d "$D/whlx" pytest pytest-asyncio pytest-timeout hypothesis py-spy
$PIP --no-deps -d "$D/whlx" llguidance==1.9.1  # function calls only (imported when a request has tools)
$PIP --no-deps -d "$D/whls" "sphn>=0.2,<0.3"
$PIP --no-deps -d "$D/whlt" transformers==5.24.0 tokenizers==0.23.3
python3 "$(dirname "$0")/slim_transformers.py" "$D"/whlt/transformers-*.whl
# What the image has already (or nothing here imports): dropped, so the image's copies are used.
rm -f "$D"/whl/{numpy,pyyaml,PyYAML,filelock,fsspec,packaging,tqdm,click,hf_xet}-* "$D"/whlx/{packaging,typing_extensions}-*
du -sh "$D"/whl "$D"/whlx "$D"/whls "$D"/whlt
