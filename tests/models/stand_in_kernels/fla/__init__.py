"""Stand-in of flash-linear-attention (see ../README.md)."""

__version__ = "0.6.0"
