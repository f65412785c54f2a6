"""The Responses API's conversation state, kept by the router: capture, store (memory or
Redis) and the by-id routes."""
