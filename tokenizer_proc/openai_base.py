"""The base shapes of OpenAI request bodies that other request modules build on (no imports of them).

`_Strict` (strict pydantic, unknown fields ignored) and the chat message; split out of
openai_protocol.py so that tool_protocol.py can extend ChatMessage while openai_protocol.py composes
the tool fields into ChatCompletionRequest.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Strict):
    """One part of a multi-part message content; only text parts are supported."""

    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None

    def flat_content(self) -> str:
        """Content as one string (text parts joined by newlines); None becomes ""."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content)
