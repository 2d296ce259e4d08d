"""A byte-level tokenizer and ChatML-style chat template for the tiny random models.

Why local: CI has no model hub, and without a tokenizer a server must run with
`--skip-tokenizer-init`, so the OpenAI endpoints agents use are never exercised.
Byte-level with no merges: token id = byte value (0-255), so any text (any UTF-8) is
encodable, a prompt's token count is its UTF-8 byte count, and a chat history that grows
by appending messages grows by appending tokens (the prefix cache sees the reuse).
The special tokens follow the bytes and stay inside the models' vocabulary (1024).
"""

from __future__ import annotations

from pathlib import Path

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 256, 257, 258

# ChatML with tools: tool schemas first (so they stay in every turn's prefix), then each
# message; an assistant's tool calls are rendered after its text. A turn's prompt is a
# prefix of the next turn's prompt, as with real agent templates.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% if message.content is string %}{{ message.content }}"
    "{% elif message.content %}{% for part in message.content %}"
    "{% if part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}{% endif %}"
    "{% for call in message.tool_calls or [] %}{{ '\\n' }}<tool_call>"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}'
    "</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte value, indexed by the byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def build_tokenizer(target: Path) -> Path:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into `target`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: byte for byte, symbol in enumerate(byte_symbols())}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=CHAT_TEMPLATE,
        model_max_length=8192,
    )
    tokenizer.save_pretrained(target)
    return target
