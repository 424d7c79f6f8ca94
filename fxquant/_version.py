"""The package version (one place: ``fxquant.__version__``, ``fxquant --version``, the
build metadata)."""

__version__ = "0.10.4"
