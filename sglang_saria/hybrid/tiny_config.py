"""Config of the tiny random Qwen3.5-style hybrid model used by CPU tests and benchmarks.

WHY a function here: sglang_saria/tiny_models.py builds every tiny model; the hybrid
one must carry the fields SGLang 0.5.23 reads, which transformers' save_pretrained
does not write, so the hybrid package owns that knowledge.
"""

from __future__ import annotations

NUM_LAYERS = 4
FULL_ATTENTION_INTERVAL = 4  # 3 GDN layers then 1 full-attention layer (Qwen3.5's 3:1)


def hybrid_model_config() -> dict:
    """Fields for ``AutoConfig.for_model(**fields)`` (model_type ``qwen3_5_text``).

    Dimensions mirror the tiny full-attention model (hidden 64, vocab 1024, 4 heads
    of 16, 2 KV heads) so the prefill benchmark compares like with like. Fields that
    save_pretrained drops and SGLang needs:
    - ``full_attention_interval``: SGLang's ``Qwen3NextConfig.layers_block_type``
      reads only this (transformers writes ``layer_types``);
    - ``architectures``: selects SGLang's ``Qwen3_5ForCausalLM`` text model.
    ``mamba_chunk_size`` is left at SGLang's default 64, the GDN chunk size, so
    prefix-cache checkpoints fall on chunk boundaries.
    """
    layer_types = [
        "full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention"
        for i in range(NUM_LAYERS)
    ]
    return {
        "model_type": "qwen3_5_text",
        "architectures": ["Qwen3_5ForCausalLM"],
        "vocab_size": 1024,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "layer_types": layer_types,
        "full_attention_interval": FULL_ATTENTION_INTERVAL,
    }
