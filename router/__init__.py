"""Regional router: OpenAI-compatible proxy scheduling requests over GPU backends."""
