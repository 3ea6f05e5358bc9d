"""The inference engine every sampler goes through: paged KV, continuous batching, shared
prefixes (rlcode.engine.engine)."""

from rlcode.engine.engine import Engine
from rlcode.engine.pages import PagePool
from rlcode.engine.requests import Candidate, Request, Result

__all__ = ["Candidate", "Engine", "PagePool", "Request", "Result"]
