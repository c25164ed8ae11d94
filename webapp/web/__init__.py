"""The chat web application: `create_app` builds it, `python -m webapp` serves it."""

from webapp.web.app import create_app

__all__ = ["create_app"]
