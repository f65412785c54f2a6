"""The router's view of its backends: who they are (Consul membership or the config), their
health probes and reports, their priors, and the scheduler assembled over them; the router's
own registration in Consul."""
