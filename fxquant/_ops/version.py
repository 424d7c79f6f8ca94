"""A fingerprint of fxquant's numerics, carried into compiled graphs.

Inductor and AOTAutograd cache compiled graphs on disk, keyed by the graph dynamo
captured. A registered op's decomposition is not part of that key, so after an upgrade of
fxquant a cached kernel compiled from the old numerics could be reused. Every call that
fxquant makes passes :data:`NUMERICS` to its ops as a constant argument: it is written into
the captured graph, so the cache key changes whenever the numerics' source changes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Final

__all__ = ["NUMERICS", "numerics_fingerprint"]

_PACKAGE = Path(__file__).resolve().parent.parent


def numerics_fingerprint(root: Path = _PACKAGE) -> str:
    """A short hash of the source of the registered ops, the formats and the vocabulary.

    Example:
        >>> len(numerics_fingerprint())
        16
    """
    digest = hashlib.sha256()
    files = [*sorted((root / "_ops").glob("*.py")), root / "formats.py", root / "modes.py"]
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


#: The fingerprint of the installed numerics.
NUMERICS: Final = numerics_fingerprint()
