"""Pool sizes: the router's own autoscaler, and `gpuroute scale`'s loop over routers with
its executors."""
