# sglang-saria: `make demo` runs the main job on an embedded default, `make test` the tests.
# Both create .venv/ on first use (scripts/setup.sh) and reuse it afterwards.
PY := .venv/bin/python
MODELS := models/qwen3-tiny/config.json models/qwen3.5-tiny-hybrid/config.json

.PHONY: setup models bench-models demo test test-slow test-fast check-patches clean

setup:
	@bash scripts/setup.sh

$(MODELS): sglang_saria/tiny_models.py sglang_saria/hybrid/tiny_config.py sglang_saria/agents/tokenizer.py | setup
	@$(PY) -m sglang_saria.tiny_models --out models qwen3-tiny qwen3.5-tiny-hybrid

models: setup $(MODELS)

# Real-shaped random models for saria-bench-models and the benchmarks' --model (16 KiB of
# KV per token, about 430 MB together); no test needs them.
bench-models: setup
	@$(PY) -m sglang_saria.tiny_models --out models qwen3-bench qwen3.5-bench-hybrid

demo: models
	@$(PY) -m sglang_saria.demo

# Three pytest-xdist workers, one test file at a time each (a file's servers start once): a
# server test leaves part of the 2-core machine idle (process startup, waits for the store, kill
# and restart loops), so a third worker fills those gaps (tests/conftest.py lowers SGLang's host
# memory reserve so three workers' servers fit, rig patch 015).
TEST_WORKERS ?= 3

# `make test` leaves out the long server loops (marker slow: kill/restart loops, tp2, the ported
# SGLang storage scenarios, the bench client) to stay within 15 minutes; `make test-slow` runs
# them, and CI (.ci/run) runs both.
test: models
	@$(PY) -m pytest tests -q -n $(TEST_WORKERS) --dist loadfile --durations=15 -m "not slow"

test-slow: models
	@$(PY) -m pytest tests -q -n $(TEST_WORKERS) --dist loadfile --durations=10 -m slow

test-fast: models  # everything but the real-server (e2e) tests
	@$(PY) -m pytest tests -q -n $(TEST_WORKERS) --dist loadfile -m "not e2e"

check-patches: setup  # the CPU rig's SGLang patches still apply (rig/README.md)
	@$(PY) -m saria_cpu_rig.apply_patches --check

clean:
	rm -rf .venv models .pytest_cache
