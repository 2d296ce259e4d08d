"""SGLang 0.5.23 request-validation bugs kept fixed, as hooks (each names the upstream report).

- Unknown model (sgl-project/sglang#7035, #31404): the OpenAI endpoints serve any model name
  with their one model and echo the name back, so an agent pointed at the wrong server gets
  plausible answers from another model. OpenAI and vLLM answer 404 "model does not exist"; so
  does this hook. The served name, "default" (SGLang's documented default) and either with a
  `:<lora adapter>` suffix stay accepted.
- Out-of-range request values (sgl-project/sglang#28088, #27482): an input token id outside
  the vocabulary, `logprob_start_len` < -1, `top_logprobs_num` < 0 or sampling `n` < 1 reached
  the scheduler unchecked and stopped it (IndexError in the embedding, an assertion in the
  logprob processor): every tenant lost service. Refused (400) where SGLang validates a
  request's length, per sub-request, with min/max over the ids.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

logger = logging.getLogger(__name__)


def register() -> None:
    HookRegistry.register("sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase.handle_request",
                          refuse_unknown_model, HookType.AROUND)
    HookRegistry.register("sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
                          refuse_out_of_range, HookType.BEFORE)


def unknown_model_error(serving: Any, requested: Any) -> Optional[str]:
    """Why ``requested`` is not the model ``serving`` serves; None when it is (or names none)."""
    from sglang.srt.entrypoints.openai.protocol import DEFAULT_MODEL_NAME

    if not isinstance(requested, str):
        return None
    served = serving.tokenizer_manager.served_model_name
    base, _adapter = serving._parse_model_parameter(requested)
    if base in (served, DEFAULT_MODEL_NAME):
        return None
    return (f"The model `{requested}` does not exist on this server; it serves `{served}` "
            f"(send that name or `{DEFAULT_MODEL_NAME}`).")


async def refuse_unknown_model(original: Callable, serving: Any, request: Any, raw_request: Any) -> Any:
    error = unknown_model_error(serving, getattr(request, "model", None))
    if error is not None:
        logger.warning("Rejected request: %s", error)
        return serving.create_error_response(error, err_type="NotFoundError", status_code=404, param="model")
    return await original(serving, request, raw_request)


def out_of_range_error(obj: Any, input_ids: Optional[list[int]], vocab_size: int) -> Optional[str]:
    """The first request value the scheduler would index out of range with; None if all fit."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    if input_ids:
        low, high = min(input_ids), max(input_ids)
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            return f"input_ids holds token id {bad}, outside the model's vocabulary [0, {vocab_size})."
    if not isinstance(obj, GenerateReqInput):
        return None
    for name, value, least in (
        ("logprob_start_len", obj.logprob_start_len, -1),
        ("top_logprobs_num", obj.top_logprobs_num, 0),
        ("n", (obj.sampling_params or {}).get("n", 1) if isinstance(obj.sampling_params, dict) else 1, 1),
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value < least:
            return f"{name}={value}: must be >= {least}."
    return None


def refuse_out_of_range(manager: Any, obj: Any, input_ids: Optional[list[int]], *args: Any, **kwargs: Any) -> None:
    error = out_of_range_error(obj, input_ids, manager.model_config.vocab_size)
    if error is not None:
        raise ValueError(error)
