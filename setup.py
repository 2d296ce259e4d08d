"""sglang-saria: an SGLang 0.5.23 HiCache extension (storage backend `saria`) plus replay tools.

Installed next to a stock `sglang==0.5.23`, it registers itself through SGLang's plugin entry
point (`sglang.srt.plugins`); no SGLang file is edited."""

from setuptools import find_packages, setup

setup(
    name="sglang-saria",
    version="0.1.0",
    description="Persistence-aware SSD KV caching with coordinated DRAM-SSD reload for SGLang",
    packages=find_packages(include=["sglang_saria", "sglang_saria.*"]),
    python_requires=">=3.11",
    install_requires=["numpy", "tqdm", "xxhash", "msgspec"],
    extras_require={"sglang": ["sglang==0.5.23"], "cluster": ["sglang-router==0.3.2", "aiohttp"]},
    entry_points={
        "console_scripts": [
            "saria-replay=sglang_saria.replay.cli:main",
            "saria-plan=sglang_saria.replay.planning.cli:main",
            "saria-fleet-table=sglang_saria.replay.fleet_table:main",
            "saria-admission-sweep=sglang_saria.bench.admission_sweep:main",
            "saria-admission-budget=sglang_saria.bench.admission_budget:main",
            "saria-restart-turns=sglang_saria.bench.restart_turns:main",
            "saria-fig10=sglang_saria.bench.fig10:main",
            "saria-bench-models=sglang_saria.bench.models:main",
            "saria-bench-tree=sglang_saria.bench.tree:main",
            "saria-bench-storage=sglang_saria.bench.storage:main",
            "saria-bench-reload=sglang_saria.bench.reload:main",
            "saria-fidelity=sglang_saria.fidelity.table:main",
            "saria-hybrid-placement=sglang_saria.fidelity.placement:main",
            "saria-make-tiny-models=sglang_saria.tiny_models:main",
        ],
        "sglang.srt.plugins": ["saria = sglang_saria.plugin:register"],
    },
)
