# sglang-saria: `make demo` runs the main job on an embedded default, `make test` the tests.
# Both create .venv/ on first use (scripts/setup.sh) and reuse it afterwards.
PY := .venv/bin/python
MODELS := models/qwen3-tiny/config.json models/qwen3.5-tiny-hybrid/config.json

.PHONY: setup models demo test test-fast check-patches clean

setup:
	@bash scripts/setup.sh

$(MODELS): scripts/make_tiny_models.py sglang_saria/agents/tokenizer.py | setup
	@$(PY) scripts/make_tiny_models.py --out models qwen3-tiny qwen3.5-tiny-hybrid

models: setup $(MODELS)

demo: models
	@$(PY) -m sglang_saria.demo

test: models
	@$(PY) -m pytest tests -q

test-fast: models  # everything but the real-server (e2e) tests
	@$(PY) -m pytest tests -q -m "not e2e"

check-patches: setup
	@$(PY) scripts/apply_patches.py --check

clean:
	rm -rf .venv models .pytest_cache
