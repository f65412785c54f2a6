"""What stands in for real infrastructure on one machine: fake engine and GPU, fleet host,
Consul dev agent, free ports, child processes."""
