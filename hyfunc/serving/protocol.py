"""OpenAI Chat Completions wire format: the request the server accepts and the responses it sends.

Requests are validated in pydantic's strict mode: a field of the wrong JSON type (``"stream":
"yes"``, ``"max_tokens": "5"``) is an error, as it is for OpenAI, rather than silently coerced.
Unknown fields are ignored (``extra="ignore"``), again as OpenAI does, so clients that send
newer parameters (``logprobs``, ``store``, ``metadata`` ...) keep working.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

_REQUEST = ConfigDict(extra="ignore", strict=True)


class TextPart(BaseModel):
    """A content part; only text parts can be read (the models take no images or audio)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    type: str
    text: str | None = None


Content = Union[str, list[TextPart]]


class FunctionCallIn(BaseModel):
    model_config = _REQUEST
    name: str
    arguments: str  # a JSON string of an object, as OpenAI sends it back in the conversation


class ToolCallIn(BaseModel):
    model_config = _REQUEST
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class SystemMessage(BaseModel):
    model_config = _REQUEST
    role: Literal["system", "developer"]
    content: Content
    name: str | None = None


class UserMessage(BaseModel):
    model_config = _REQUEST
    role: Literal["user"]
    content: Content
    name: str | None = None


class AssistantMessage(BaseModel):
    model_config = _REQUEST
    role: Literal["assistant"]
    content: Content | None = None
    tool_calls: list[ToolCallIn] | None = None
    name: str | None = None


class ToolMessage(BaseModel):
    model_config = _REQUEST
    role: Literal["tool"]
    content: Content
    tool_call_id: str


Message = Annotated[Union[SystemMessage, UserMessage, AssistantMessage, ToolMessage], Field(discriminator="role")]


class FunctionDef(BaseModel):
    model_config = _REQUEST
    name: str
    description: str | None = None
    # Checked by `hyfunc.parse_tools` afterwards, whose errors name the tool and the field.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    model_config = _REQUEST
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = _REQUEST
    name: str


class NamedToolChoice(BaseModel):
    model_config = _REQUEST
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(BaseModel):
    model_config = _REQUEST
    include_usage: bool | None = None


class ChatCompletionRequest(BaseModel):
    model_config = _REQUEST
    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Union[Literal["auto", "none", "required"], NamedToolChoice] | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    # Accepted for compatibility; decoding is always greedy (deterministic), whatever is asked.
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    n: int | None = Field(default=None, ge=1, le=1)  # one choice only
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    seed: int | None = None


# ---------------------------------------------------------------------------------------------
# Responses


class FunctionCallOut(BaseModel):
    name: str
    arguments: str  # JSON text of an object


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCallOut] | None = None
    refusal: str | None = None


class Choice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    trimmed_messages: int | None = None  # the oldest messages left out to fit the model's context


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "hyfunc"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class Health(BaseModel):
    status: Literal["ok", "loading", "failed"]
    detail: str | None = None
    traffic: dict | None = None  # the traffic log's counters, when the server logs traffic


class Liveness(BaseModel):
    status: Literal["live"]


class Readiness(BaseModel):
    status: Literal["ready", "degraded", "loading", "failed"]
    detail: str | None = None
