"""The front stages of a request, in the order a client hears of them: key and tenant, body
and parse, residency, quota, admission and SLO holds."""
