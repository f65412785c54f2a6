"""gpuroute: a multi-region request router for AI-inference GPU fleets."""

__version__ = "0.1.0"
