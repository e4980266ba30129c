"""Grammar-constrained decoding on xgrammar: specs, compilation, per-request matchers, bitmasks.

Process split: `spec` and `validate_spec` run anywhere (the tokenizer process turns a bad grammar
into an HTTP 400); `GrammarCompilerService`, `RequestMatcher` and `BitmaskFiller` live in the
scheduler process; `apply_token_bitmask` runs in the worker. See docs/structured-outputs.md.
"""

from __future__ import annotations

from radixrt.constrained.bitmask import allocate_bitmask, apply_token_bitmask, bitmask_width
from radixrt.constrained.compiler import GrammarCompilerService, GrammarHandle, build_tokenizer_info
from radixrt.constrained.errors import GrammarError
from radixrt.constrained.matcher import BitmaskFiller, RequestMatcher
from radixrt.constrained.spec import GrammarKind, GrammarSpec, spec_from_request, validate_spec

__all__ = [
    "BitmaskFiller", "GrammarCompilerService", "GrammarError", "GrammarHandle", "GrammarKind",
    "GrammarSpec", "RequestMatcher", "allocate_bitmask", "apply_token_bitmask", "bitmask_width",
    "build_tokenizer_info", "spec_from_request", "validate_spec",
]
