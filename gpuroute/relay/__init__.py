"""Relaying an answer to its client, the same at both tiers: the body and how a broken one
ends, what a tier asked for on its client's behalf stripped, the client's writer with its
deadline, and the usage read from the whole answer."""
