# Pure logic, no provider: everything here can be planned and tested offline
# (`terraform test`). The AWS modules take these values as inputs.

locals {
  # The AWS GPU instance catalog gpuroute itself reads (check-config, tfvars, plan), in the
  # order defaults are chosen: for a GPU type, the first instance holding whole engines.
  catalog_list = jsondecode(file("${path.module}/../../../../fleet/aws_gpu_instances.json")).instances
  catalog      = { for i in local.catalog_list : i.name => i }
  catalog_gpus = distinct([for i in local.catalog_list : i.gpu])

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

  # Every pool, keyed "<region>/<pool name>" (default name: "<gpu>-<index in region>"), with
  # its instance type (the pool's, else the catalog's first of its GPU whose GPUs hold a
  # whole number of engines) and that instance's GPUs (the catalog's, else the pool's).
  pools = merge([
    for region, r in var.regions : {
      for i, p in r.gpu_pools : "${region}/${coalesce(p.name, "${lower(p.gpu)}-${i}")}" => merge(p, {
        region      = region
        index       = i
        engine_gpus = p.tensor_parallel * p.pipeline_parallel
        instance_type = p.instance_type != null ? p.instance_type : try([
          for it in local.catalog_list : it.name if it.gpu == p.gpu && it.gpus % (p.tensor_parallel * p.pipeline_parallel) == 0
        ][0], null) # (engine_gpus above is not visible within this same merge)
      })
    }
  ]...)
  hosts_gpus = {
    for k, p in local.pools : k => try(local.catalog[p.instance_type].gpus, p.gpus_per_host)
  }
  engines_per_host = { for k, p in local.pools : k => floor(coalesce(local.hosts_gpus[k], 0) / p.engine_gpus) }

  # What the output's preconditions refuse, pool by pool (the messages name each pool). A
  # pool of count 0 gets no group, so nothing about its hosts is refused (as gpuroute
  # check-config and tfvars do not).
  problems = {
    no_instance = [for k, p in local.pools : "${k}: no instance in fleet/aws_gpu_instances.json carries ${p.gpu} GPUs in multiples of ${p.engine_gpus} (tensor_parallel x pipeline_parallel); set instance_type and gpus_per_host" if p.count > 0 && p.instance_type == null]
    unknown     = [for k, p in local.pools : "${k}: instance type ${p.instance_type} is not in fleet/aws_gpu_instances.json; give the pool's gpus_per_host" if p.count > 0 && p.instance_type != null && local.hosts_gpus[k] == null]
    # (a GPU type the catalog does not know is one the fleet file declares: it may name
    # catalog instances as its own, which gpuroute tfvars has checked)
    other_gpu   = [for k, p in local.pools : "${k}: ${p.instance_type} carries ${local.catalog[p.instance_type].gpu} GPUs, not ${p.gpu}" if p.count > 0 && contains(local.catalog_gpus, p.gpu) && try(local.catalog[p.instance_type].gpu != p.gpu, false)]
    indivisible = [for k, p in local.pools : "${k}: tensor_parallel x pipeline_parallel = ${p.engine_gpus} does not divide the ${local.hosts_gpus[k]} GPUs of ${p.instance_type}" if p.count > 0 && (local.hosts_gpus[k] == null ? false : local.hosts_gpus[k] % p.engine_gpus != 0)]
  }

  gpu_node_groups = {
    for k, p in local.pools : k => {
      region            = p.region
      name              = split("/", k)[1]
      gpu               = p.gpu
      gpus              = p.count
      instance_type     = p.instance_type
      gpus_per_host     = local.hosts_gpus[k]
      tensor_parallel   = p.tensor_parallel
      pipeline_parallel = p.pipeline_parallel
      engines_per_host  = local.engines_per_host[k]
      hosts             = ceil(p.count / max(coalesce(local.hosts_gpus[k], 1), 1))
      # an engine's weight for the router (null: the router's prior for its GPUs)
      capacity = p.capacity_weight == null ? null : p.capacity_weight * p.engine_gpus
      models   = p.models
      engine   = p.engine
      # each engine on the host: its own GPUs, engine port, agent load-stream and admin ports
      engines = [
        for e in range(local.engines_per_host[k]) : {
          index            = e
          port             = 8000 + e
          gpu_indices      = range(e * p.engine_gpus, (e + 1) * p.engine_gpus)
          load_stream_port = 7070 + 2 * e
          admin_port       = 7071 + 2 * e
        }
      ]
      az            = p.zone != null ? p.zone : var.regions[p.region].azs[p.index % length(var.regions[p.region].azs)]
      min_hosts     = p.min_hosts
      max_hosts     = p.max_hosts
      standby_hosts = p.standby_hosts
    } if p.count > 0
  }
}
