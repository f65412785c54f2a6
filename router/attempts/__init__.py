"""A request's attempts at backends: place, send, first bytes, relay, settle; retries,
rescues and the continuation of a broken stream."""
