"""State the router replicas share through Redis: the client, quotas and keys, sessions,
outstanding load."""
