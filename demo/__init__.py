"""`gpuroute demo`: a one-machine fleet, and three regions behind the global tier."""
