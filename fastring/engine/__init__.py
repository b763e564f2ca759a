"""The engine: queued requests and their handles, cross-rank negotiation, fusion, the stall
inspector, join and the timeline. It runs what the api submits with the algorithms below it."""
from .engine import Engine
from .request import Handle, Request

__all__ = ["Engine", "Handle", "Request"]
