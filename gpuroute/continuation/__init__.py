"""The continuation of a stream whose engine broke mid-answer, shared by both tiers: the
text so far and what can go on (`text.py`), the verdict, the splice and its seam, and the
I/O loop (`relay.py`)."""
