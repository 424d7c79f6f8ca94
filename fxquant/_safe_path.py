"""``python -m fxquant`` from any folder imports fxquant's own dependencies.

``python -m`` puts the working directory first on ``sys.path``, so a ``tabulate.py`` (or
``torch.py``) lying there would be imported instead of the real package. While Python
locates the module to run with ``-m``, ``sys.argv[0]`` is ``"-m"``: only then, this
drops that first entry, as ``python -P`` would. Imported first by ``fxquant/__init__``;
any other import of fxquant leaves ``sys.path`` alone.
"""

from __future__ import annotations

import os
import sys

if sys.argv[:1] == ["-m"] and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]
