"""Flare: always-on anomaly diagnosis for distributed training. The `flare` command line."""

__version__ = "0.1.0"
