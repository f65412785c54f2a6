"""`gpuroute plan`: the cheapest fleet that meets each model's SLO, found by running the
simulator, and the fleet file it writes."""
