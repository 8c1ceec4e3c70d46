"""Prefect flows. Importing this package first applies offline-friendly Prefect defaults."""

from flows import prefect_defaults  # noqa: F401
