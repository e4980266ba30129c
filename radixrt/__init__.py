"""radixrt: an LLM serving runtime centred on a radix-tree prefix cache over reference-counted KV pages."""

__version__ = "0.1.0"


def __getattr__(name: str):  # lazy: `import radixrt` must not import torch
    if name == "Engine":
        from radixrt.engine import Engine

        return Engine
    raise AttributeError(name)
