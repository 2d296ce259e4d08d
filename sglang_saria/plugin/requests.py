"""Agents' cache hints on chat completions: `"saria": {"session": id, "end": true}` or
`"saria": {"session": id, "expect_return_s": s}` (openai SDK: `extra_body`).

Stock SGLang drops unknown body fields, so the request model is replaced (a class REPLACE hook:
SGLang rebinds every module's import of it) by a subclass with the `saria` field, validated when
the body is parsed (400 naming the field: `saria.session`, `saria.end`, ...). The hint rides to
the scheduler in `sampling_params.custom_params`, the per-request channel SGLang carries through
every tokenizer and scheduler path. The rules are in `hicache/hints.py`.

The subclass also refuses a body that is not a JSON object (400): the request model's own
"before" validators call `.get()` on it, so a JSON null, array or number raised
AttributeError, a 500 with a traceback (vllm-project/vllm#51654 is the same bug in vLLM).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from pydantic import field_validator, model_validator
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.plugins.hook_registry import HookRegistry, HookType

TARGET = "sglang.srt.entrypoints.openai.protocol.ChatCompletionRequest"


class SariaChatCompletionRequest(ChatCompletionRequest):
    """SGLang's chat completion request with an agent's cache hint."""

    saria: Optional[Dict[str, Any]] = None

    @model_validator(mode="before")
    @classmethod
    def body_is_object(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            raise ValueError(f"The request body must be a JSON object, got {type(values).__name__}")
        return values

    @field_validator("saria", mode="before")
    @classmethod
    def validate_saria_hint(cls, value: Any) -> Optional[dict[str, Any]]:
        from sglang_saria.hicache.hints import validate_field

        return validate_field(value)

    def to_sampling_params(self, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        params = super().to_sampling_params(*args, **kwargs)
        if self.saria is not None:
            from sglang_saria.hicache.hints import attach_hint

            attach_hint(params, self.saria)
        return params


SariaChatCompletionRequest.__name__ = ChatCompletionRequest.__name__  # OpenAPI schema name


def register() -> None:
    HookRegistry.register(TARGET, SariaChatCompletionRequest, HookType.REPLACE)
