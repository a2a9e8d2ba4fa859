"""The package's version: a leaf every module may import (pyproject.toml says the same number)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
