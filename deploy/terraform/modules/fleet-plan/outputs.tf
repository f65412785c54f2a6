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
  description = "One node group per GPU pool, keyed \"<region>/<pool name>\": region, instance type and its GPUs, host count (GPUs rounded up to whole instances: the size at creation), tensor and pipeline parallelism, the engines packed on each host (their GPUs, engine port, agent load-stream and admin ports), the pool's engine (kind, image, arguments, Hugging Face token reference), models, AZ, and the autoscaling bounds and warm standby in hosts (null bounds = the host count)."
  value       = local.gpu_node_groups

  precondition {
    condition     = length(local.problems.no_instance) == 0
    error_message = "A GPU pool has no instance type: ${join("; ", local.problems.no_instance)}."
  }

  precondition {
    condition     = length(local.problems.unknown) == 0
    error_message = "A GPU pool names an instance type the catalog does not know, without gpus_per_host: ${join("; ", local.problems.unknown)}."
  }

  precondition {
    condition     = length(local.problems.other_gpu) == 0
    error_message = "A GPU pool's instance type carries another GPU type: ${join("; ", local.problems.other_gpu)}."
  }

  precondition {
    condition     = length(local.problems.indivisible) == 0
    error_message = "A GPU pool's engines do not fill its hosts' GPUs (each engine takes tensor_parallel x pipeline_parallel GPUs of one host): ${join("; ", local.problems.indivisible)}."
  }
}

output "instance_catalog" {
  description = "The AWS GPU instance catalog (fleet/aws_gpu_instances.json) by instance type: GPU type, GPUs, GPU memory, interconnect, instance storage."
  value       = local.catalog
}
