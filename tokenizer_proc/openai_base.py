"""The base shapes of OpenAI request bodies that other request modules build on (no imports of them).

`_Strict` (strict pydantic, unknown fields ignored) and the chat message; split out of
openai_protocol.py so that tool_protocol.py can extend ChatMessage while openai_protocol.py composes
the tool fields into ChatCompletionRequest.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Strict):
    """One part of a multi-part message content; only text parts are supported."""

    type: Literal["text"]
    text: str

    @field_validator("type", mode="before")
    @classmethod
    def _text_only(cls, v: Any) -> Any:
        if isinstance(v, str) and v != "text":
            raise ValueError(f"non-text content parts (images, audio, files) are not supported, got {v!r}; "
                             'send text parts {"type": "text", "text": ...}')
        return v


def _content_kind(v: Any) -> str:
    return "list[part]" if isinstance(v, list) else "str"


# A list is judged as a list of parts only, so that its error names the part at fault
# (`messages[0].content[1].type`) rather than saying the content should have been a string. The tags
# contain "[" or are "str": errors._loc_to_param drops them from the parameter's name.
MessageContent = Annotated[Annotated[str, Tag("str")] | Annotated[list[TextPart], Tag("list[part]")],
                           Discriminator(_content_kind)]


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: MessageContent | None = None
    name: str | None = None
    tool_call_id: str | None = None

    def flat_content(self) -> str:
        """Content as one string (text parts joined by newlines); None becomes ""."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content)
