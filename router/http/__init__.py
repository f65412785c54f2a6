"""The router's HTTP app: `server.py` builds every part and serves; `proxy.py` holds the
entry points each route calls (front stages, then the attempts)."""
