"""The HTTP/1.1 client of the router (to engines) and of the global tier (to routers): the
connection pool (`client.py`), the request head, the answer's body."""
