"""Request bodies of the HTTP API (OpenAI chat/completions and the native /generate), validated strictly.

Validation is pydantic in strict mode (no "1" -> 1 coercion); range checks that OpenAI documents live
here too, so a bad value yields a 400 whose `param` names the field (see errors.py). Unknown fields
are ignored, as vLLM and SGLang do, so that clients which send newer OpenAI fields keep working.
Responses are plain dicts built in the serving modules (cheaper than models on the hot path).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from radixrt.sampling_params import MIN_REPETITION_PENALTY

from .openai_base import ChatMessage, TextPart, _Strict
from .tool_protocol import ToolChatMessage, ToolFields

__all__ = ["ChatCompletionRequest", "ChatMessage", "CompletionRequest", "ConstraintFields",
           "GenerateRequest", "ResponseFormat", "SamplingFields", "StreamOptions", "TextPart"]

NonNegInt = Annotated[int, Field(ge=0)]
CacheSalt = Annotated[str, Field(min_length=1, max_length=256)]  # tenant of the prefix cache (vLLM's name)
TokenIds = Annotated[list[NonNegInt], Field(min_length=1)]
MAX_STOP_STRINGS = 16


def check_stop_strings(stop: list[str]) -> None:
    """The rule for stop strings on every route (chat, completions, Messages, /generate).

    Raises:
        ValueError: an empty string, or more than MAX_STOP_STRINGS.
    """
    if any(s == "" for s in stop):
        raise ValueError("stop strings must be non-empty")
    if len(stop) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are supported")


def check_logit_bias_keys(bias: dict[str, float]) -> None:
    """The rule for logit_bias keys on every route: token ids in ASCII decimal digits (leading zeros
    allowed). int() alone would also take " 5", "+5" or "\u0665" (an Arabic-Indic five), and
    str.isdigit() takes "\u00b2", which int() then refuses.

    Raises:
        ValueError: a key that is not `[0-9]+`.
    """
    for key in bias:
        if not (key.isascii() and key.isdigit()):
            raise ValueError(f"keys must be token ids (decimal digits 0-9), got {key!r}")


class StreamOptions(_Strict):
    include_usage: bool | None = False


class JsonSchemaFormat(_Strict):
    """`response_format.json_schema`: the schema the output must match (OpenAI's structured outputs)."""

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """`response_format`: free text, any JSON object, or JSON matching `json_schema.schema`."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('response_format: type "json_schema" needs '
                             '"json_schema": {"name": ..., "schema": {...}}')
        return self

    def as_dict(self) -> dict[str, Any]:
        """The OpenAI dict (what radixrt.constrained.spec_from_request reads)."""
        out: dict[str, Any] = {"type": self.type}
        if self.json_schema is not None:
            out["json_schema"] = {"name": self.json_schema.name, "schema": self.json_schema.schema_}
        return out


class ConstraintFields(_Strict):
    """Output constraints, on chat and completions: OpenAI's `response_format` and SGLang's `regex`,
    `ebnf` and `json_schema` (the schema as JSON text). At most one per request (request_grammar.py
    checks that, and the grammar itself)."""

    response_format: ResponseFormat | None = None
    regex: str | None = None
    ebnf: str | None = None
    json_schema: str | None = None


class SamplingFields(_Strict):
    """Fields shared by chat and completions (OpenAI names, plus the usual vLLM/SGLang extensions)."""

    model: str
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=None, ge=1, le=128)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    user: str | None = None
    # extensions (vLLM / SGLang)
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, ge=MIN_REPETITION_PENALTY, le=2.0)
    ignore_eos: bool | None = False
    stop_token_ids: list[NonNegInt] | None = None
    skip_special_tokens: bool | None = True
    cache_salt: CacheSalt | None = None

    @field_validator("stop")
    @classmethod
    def _stop_nonempty(cls, v: str | list[str] | None) -> str | list[str] | None:
        check_stop_strings([v] if isinstance(v, str) else (v or []))
        return v

    @field_validator("top_k")
    @classmethod
    def _top_k_range(cls, v: int | None) -> int | None:
        if v is not None and v != -1 and v < 1:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias_keys(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        check_logit_bias_keys(v or {})
        return v

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(ToolFields, ConstraintFields, SamplingFields):
    """POST /v1/chat/completions (tool fields: tool_protocol.ToolFields; constraints: ConstraintFields)."""

    messages: list[ToolChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # extensions
    add_generation_prompt: bool | None = True
    # vLLM's: the reply continues the final (assistant) message instead of starting a new turn
    # (Anthropic's prefill); needs add_generation_prompt false
    continue_final_message: bool | None = False
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: requires logprobs to be true")
        if self.continue_final_message:
            if self.add_generation_prompt is not False:
                raise ValueError("continue_final_message: requires add_generation_prompt to be false")
            if self.messages[-1].role != "assistant":
                raise ValueError("continue_final_message: the last message must be an assistant message")
        # a tool result answers a call of an earlier assistant message (OpenAI's 400 as well; the
        # Responses and Messages APIs check their own pairing)
        calls: set[str] = set()
        for i, m in enumerate(self.messages):
            if m.role == "tool" and m.tool_call_id not in calls:
                raise ValueError(f"messages[{i}].tool_call_id: {m.tool_call_id!r} answers no tool call of an "
                                 "earlier assistant message")
            calls.update(c.id for c in m.tool_calls or ())
        return self

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


PromptType = str | Annotated[list[str], Field(min_length=1)] | TokenIds | Annotated[
    list[TokenIds], Field(min_length=1)]


class CompletionRequest(ConstraintFields, SamplingFields):
    """POST /v1/completions. max_tokens defaults to 16, as in OpenAI's legacy completions API."""

    prompt: PromptType
    echo: bool | None = False
    logprobs: int | None = Field(default=None, ge=0, le=20)
    best_of: int | None = Field(default=None, ge=1, le=128)
    suffix: str | None = None
    return_token_ids: bool | None = False  # vLLM's extension: each choice also carries its token ids

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix is not supported by this server")
        return v

    @model_validator(mode="after")
    def _best_of_is_n(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise ValueError("best_of: only best_of == n is supported")
        return self


class GenerateRequest(_Strict):
    """POST /generate (native): text or input_ids, plus a `sampling_params` dict of SamplingParams fields."""

    text: str | Annotated[list[str], Field(min_length=1)] | None = None
    input_ids: TokenIds | Annotated[list[TokenIds], Field(min_length=1)] | None = None
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    stream: bool | None = False
    return_logprob: bool | None = False
    top_logprobs_num: int | None = Field(default=0, ge=0, le=20)
    # SGLang's request id(s): one per prompt, `meta_info.id` and the key of POST /abort_request
    rid: str | list[str] | None = None  # checked in serving_generate._client_rids
    cache_salt: CacheSalt | None = None
    # SGLang's multimodal inputs: refused (a 400 naming the field), not ignored, as chat refuses images
    image_data: None = None
    audio_data: None = None
    video_data: None = None

    @field_validator("image_data", "audio_data", "video_data", mode="before")
    @classmethod
    def _text_only(cls, v: Any) -> Any:
        if v is not None:
            raise ValueError("image, audio and video input are not supported (this server takes text or "
                             "token ids only)")
        return v

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("text: give exactly one of text and input_ids")
        return self
