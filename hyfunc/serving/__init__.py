"""The OpenAI-compatible server: `create_app` builds it, `hyfunc serve` runs it."""
from hyfunc.serving.app import create_app
from hyfunc.serving.service import ChatService, Outcome, Prepared, Router, ServeConfig

__all__ = ["ChatService", "Outcome", "Prepared", "Router", "ServeConfig", "create_app"]
