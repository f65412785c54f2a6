"""The router's configuration file: the loader (`router.py`) and one module per section."""
