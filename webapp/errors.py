"""Exceptions that are part of the public API."""

from __future__ import annotations


class UserError(Exception):
    """A misuse the caller can fix; the message says what to do."""


class GuardrailTripped(Exception):
    """Raised by an output guardrail to fail the run."""


class ModelError(Exception):
    """A model endpoint failed (network, HTTP status, malformed stream)."""
