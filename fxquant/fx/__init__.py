"""The floor both wings stand on: tracing GNNs with torch.fx, and where things come from.

- :mod:`~fxquant.fx.tracer`: :func:`trace` keeps PyG ``MessagePassing`` layers as leaves.
- :mod:`~fxquant.fx.standardize`: functional dropout -> ``nn.Dropout`` (train/eval safe).
- :mod:`~fxquant.fx.guards`: arguments fixed while tracing stay checked at run time.
- :mod:`~fxquant.fx.lazy`: lazy layers refused, with the fix, before anything runs.
- :mod:`~fxquant.fx.degree`: in-degree, and the one check of a user's ``edge_index``.
- :mod:`~fxquant.fx.selectors`: which layers ``layers=`` names.
- :mod:`~fxquant.fx.locations`: the user's source line of a frame, traceback or node.
- :mod:`~fxquant.fx.serial`: the process-wide lock for tracing and linting.
"""

from fxquant.fx.locations import Location
from fxquant.fx.tracer import GNNTracer, TraceError, trace

__all__ = ["GNNTracer", "Location", "TraceError", "trace"]
