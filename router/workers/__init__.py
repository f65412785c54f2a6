"""`--workers N`: the parent process, the workers' shared board, the one admin listener, how
a router process runs."""
