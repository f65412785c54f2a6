"""The operator's side of a router: the admin API, hot reload, API keys added at run time,
`gpuroute admin` and `gpuroute explain`."""
