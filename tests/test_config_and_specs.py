import pytest

from sglang_saria.config import ConfigError, SariaConfig
from sglang_saria.model_specs import MODEL_SPECS, get_model_spec


def test_from_dict_rejects_unknown_keys_naming_them():
    with pytest.raises(ConfigError, match=r"extra-config: unknown key 'admision'"):
        SariaConfig.from_dict({"admision": {}}, source="extra-config")
    with pytest.raises(ConfigError, match=r"unknown key promotion.'rate'"):
        SariaConfig.from_dict({"promotion": {"rate": 0.4}}, source="extra-config")


def test_from_dict_names_bad_field_and_value():
    with pytest.raises(ConfigError, match=r"promotion.ratio=1.5"):
        SariaConfig.from_dict({"promotion": {"ratio": 1.5}})
    with pytest.raises(ConfigError, match=r"admission.policy='eviction:E0'"):
        SariaConfig.from_dict({"admission": {"policy": "eviction:E0"}})
    with pytest.raises(ConfigError, match=r"admission.policy='lru'"):
        SariaConfig.from_dict({"admission": {"policy": "lru"}})
    with pytest.raises(ConfigError, match=r"metadata.checkpoint_tokens=1000"):
        SariaConfig.from_dict({"metadata": {"block_tokens": 512, "checkpoint_tokens": 1000}})
    with pytest.raises(ConfigError, match=r"metadata.block_tokens='512'"):
        SariaConfig.from_dict({"metadata": {"block_tokens": "512"}})
    for bad in (0, -16, "64K", 1.5, True):
        with pytest.raises(ConfigError, match=r"extra-config: transfer.max_inflight_reload_tokens=.*(positive integer|expected an integer)"):
            SariaConfig.from_dict({"transfer": {"max_inflight_reload_tokens": bad}}, source="extra-config")
    cap = SariaConfig.from_dict({"transfer": {"max_inflight_reload_tokens": 4096}}).transfer
    assert cap.max_inflight_reload_tokens == 4096
    for bad in (0, -1, "16", 2.0, False):
        with pytest.raises(ConfigError, match=r"extra-config: transfer.reload_chunk_pages=.*(positive integer|expected an integer)"):
            SariaConfig.from_dict({"transfer": {"reload_chunk_pages": bad}}, source="extra-config")
    assert SariaConfig.from_dict({"transfer": {"reload_chunk_pages": 4}}).transfer.reload_chunk_pages == 4
    for bad in (0, -1.0, "30", True):
        with pytest.raises(ConfigError, match=r"extra-config: transfer.reload_hold_s=.*(positive number|expected)"):
            SariaConfig.from_dict({"transfer": {"reload_hold_s": bad}}, source="extra-config")
    assert SariaConfig.from_dict({"transfer": {"reload_hold_s": 5}}).transfer.reload_hold_s == 5


def test_from_dict_round_trips_and_parses_capacities():
    cfg = SariaConfig.from_dict({"capacity": {"dram_tokens": "1M", "ssd_tokens": "10M"}, "admission": {"policy": "combined:E2R8"}})
    assert cfg.capacity.ssd_tokens == 10_000_000
    assert SariaConfig.from_dict(cfg.to_dict()) == cfg


def test_qwen3_8b_kv_bytes_match_paper_coordination_payload():
    spec = get_model_spec("Qwen3-8B")
    assert spec.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
    # paper 5.3: 135,168 tokens split equally between tiers are 9.28125 GiB per tier
    assert 135_168 // 2 * spec.kv_bytes_per_token == 9.28125 * 2**30


def test_hybrid_checkpoint_bytes_from_gdn_state_shapes():
    spec = get_model_spec("qwen3.5-9b")
    assert spec.is_hybrid and spec.fa_layers == 8 and spec.gdn_layers == 24
    recurrent = 32 * 128 * 128 * 4
    conv = (2 * 16 * 128 + 32 * 128) * 3 * 2
    assert spec.checkpoint_bytes == 24 * (recurrent + conv)
    assert spec.kv_bytes_per_token == 2 * 8 * 4 * 256 * 2
    assert spec.checkpoint_token_equiv * spec.kv_bytes_per_token >= spec.checkpoint_bytes
    assert spec.default_block_tokens == 1024
    small = get_model_spec("qwen3.5-5.6b")
    assert small.checkpoint_bytes * 24 == spec.checkpoint_bytes * 15
    assert get_model_spec("qwen3-1.7b").kv_bytes_per_token == 2 * 20 * 8 * 128 * 2


def test_unknown_model_lists_known_ones():
    with pytest.raises(ValueError) as e:
        get_model_spec("llama-70b")
    for name in MODEL_SPECS:
        assert name in str(e.value)
