"""The fake engine: an OpenAI-compatible server whose latency follows a GPU's roofline, with
every API vLLM serves (one module per API family)."""
