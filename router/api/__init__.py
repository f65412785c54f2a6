"""The APIs the router serves, as data: the table of routes and the work each asks for, how
their JSON bodies are read, the stateful and foreign formats, and each request's own id."""
