"""Token usage: what streams ask the engine for, what each request used, per-tenant records
for billing and `gpuroute usage`."""
