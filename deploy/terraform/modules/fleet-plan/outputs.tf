output "vpc_cidrs" {
  description = "Each region's VPC CIDR (a /16 of the supernet)."
  value       = local.vpc_cidrs
}

output "subnets" {
  description = "Per region: public and private /20 subnet CIDRs, one per availability zone, in AZ order."
  value       = local.subnets
}

output "consul_servers" {
  description = "Per region: each Consul server's name, availability zone, subnet and fixed private IP."
  value       = local.consul_servers
}

output "failover_order" {
  description = "Per region: the other regions of this fleet, nearest first (where its traffic fails over to)."
  value = {
    for name, r in var.regions : name => [for n in r.neighbours : n if n != name && contains(keys(var.regions), n)]
  }
}

output "federation" {
  description = "Per federating region: the Consul server IPs of every other federating region, for retry_join_wan."
  value = {
    for name in local.federating : name => flatten([
      for other in local.federating : [for s in local.consul_servers[other] : s.private_ip] if other != name
    ])
  }
}

output "federation_pairs" {
  description = "Unordered pairs of federating regions whose VPCs must be peered (\"a:b\" with a < b)."
  value = flatten([
    for i, a in sort(local.federating) : [for b in slice(sort(local.federating), i + 1, length(local.federating)) : "${a}:${b}"]
  ])
}

output "gpu_node_groups" {
  description = "One node group per GPU pool: region, instance type, host count (GPUs rounded up to whole instances: the size at creation), models, AZ, and the autoscaling bounds and warm standby in hosts (null bounds = the host count)."
  value       = local.gpu_node_groups
}
