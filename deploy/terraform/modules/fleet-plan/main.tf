# Pure logic, no provider: everything here can be planned and tested offline
# (`terraform test`). The AWS modules take these values as inputs.

locals {
  # GPUs per instance for each GPU type, the AWS instance type that carries them, and one
  # GPU's capacity weight against an H100 (gpuroute's priors for an 8B model; the router's
  # slowness tracking corrects what tensor parallelism does not scale linearly).
  instance_types = {
    H100 = { type = "p5.48xlarge", gpus = 8, weight = 1.0 }
    A100 = { type = "p4d.24xlarge", gpus = 8, weight = 0.41 }
    L4   = { type = "g6.xlarge", gpus = 1, weight = 0.101 }
    T4   = { type = "g4dn.xlarge", gpus = 1, weight = 0.063 }
    V100 = { type = "p3.2xlarge", gpus = 1, weight = 0.165 }
  }

  vpc_cidrs = { for name, r in var.regions : name => cidrsubnet(var.supernet, 6, r.cidr_index) }

  # /20s: public subnets take indexes 0..7, private ones 8..15, one per AZ.
  subnets = {
    for name, r in var.regions : name => {
      public  = [for i, az in r.azs : cidrsubnet(local.vpc_cidrs[name], 4, i)]
      private = [for i, az in r.azs : cidrsubnet(local.vpc_cidrs[name], 4, 8 + i)]
    }
  }

  consul_servers = {
    for name, r in var.regions : name => [
      for i in range(var.consul_servers_per_region) : {
        name       = "consul-${name}-${i + 1}"
        az         = r.azs[i % length(r.azs)]
        subnet     = local.subnets[name].private[i % length(r.azs)]
        private_ip = cidrhost(local.subnets[name].private[i % length(r.azs)], 10 + floor(i / length(r.azs)))
      }
    ]
  }

  federating = [for name, r in var.regions : name if r.federate]

  gpu_node_groups = merge([
    for name, r in var.regions : {
      for i, p in r.gpu_pools : "${name}/${lower(p.gpu)}-${i}" => {
        region        = name
        gpu           = p.gpu
        gpus          = p.count
        instance_type = local.instance_types[p.gpu].type
        gpus_per_host = local.instance_types[p.gpu].gpus
        hosts         = ceil(p.count / local.instance_types[p.gpu].gpus)
        capacity      = local.instance_types[p.gpu].weight * local.instance_types[p.gpu].gpus
        models        = p.models
        az            = p.zone != null ? p.zone : r.azs[i % length(r.azs)]
        min_hosts     = p.min_hosts
        max_hosts     = p.max_hosts
        standby_hosts = p.standby_hosts
      } if p.count > 0
    }
  ]...)
}
