"""What a router tells about itself: metrics, the access log, the decision log, spans, and
its region's report to the global tier."""
