"""gac — GPU-Aligned Compression."""

__version__ = "0.1.0"
