"""nip_core: the pure library behind the MALT pipeline (no Prefect imports here)."""

__version__ = "0.1.0"
