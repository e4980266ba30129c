"""ServingContext: what every HTTP handler is given (manager, tokenizer, limits, served model id)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from radixrt.config import ServerArgs

from .logprobs import TokenTexts
from .manager import TokenizerManager
from .request_state import RequestHandle


@dataclass
class ServingContext:
    """Everything a handler needs; built once by create_app's caller (main.build_context).

    `on_done` is called by every RequestHandle when it ends (metrics), and with handle None and
    outcome "disconnected" for a request whose client left before it was read. `texts` caches token id ->
    text for logprobs; `vocab_size` bounds every token id a request may name.
    """

    manager: TokenizerManager
    tokenizer: Any
    args: ServerArgs
    served_model: str
    context_length: int
    on_done: Callable[[RequestHandle | None, str], None] | None = None
    texts: TokenTexts = field(init=False)
    # /generate's client request ids (`rid`) in flight -> (handle, choice index), for /abort_request
    client_rids: dict[str, tuple[RequestHandle, int]] = field(init=False, default_factory=dict)
    vocab_size: int = field(init=False)

    def __post_init__(self) -> None:
        self.texts = TokenTexts(self.tokenizer)
        self.vocab_size = len(self.tokenizer)
