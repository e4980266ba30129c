"""Import `radixrt.kernels` also where the package is not installed (e.g. a GPU machine that gets
the repository as a plain tree): the repo's kernels/ directory is loaded under that name."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def import_kernels() -> ModuleType:
    """`radixrt.kernels`, installed or mapped from ROOT/kernels."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        import radixrt.kernels as kernels

        return kernels
    except ModuleNotFoundError:
        init = ROOT / "kernels" / "__init__.py"
        spec = importlib.util.spec_from_file_location("radixrt.kernels", init,
                                                      submodule_search_locations=[str(init.parent)])
        kernels = importlib.util.module_from_spec(spec)
        sys.modules["radixrt.kernels"] = kernels
        spec.loader.exec_module(kernels)
        return kernels
