variable "regions" {
  description = "The fleet's regions keyed by gpuroute region name, as `gpuroute tfvars` writes them from regions.example.toml."
  type = map(object({
    aws_region   = string
    cidr_index   = number
    jurisdiction = string
    azs          = list(string)
    federate     = optional(bool, true)
    neighbours   = list(string)
    gpu_pools = list(object({
      name   = optional(string) # default "<gpu lower>-<index in region>"
      gpu    = string
      count  = number # GPUs
      models = list(string)
      zone   = optional(string)
      # in hosts; null = hosts (a fixed group); modules/gpu-autoscaling checks them
      min_hosts     = optional(number)
      max_hosts     = optional(number)
      standby_hosts = optional(number, 0)
      # one GPU's weight for the router; null = the router's prior for the GPU type
      capacity_weight = optional(number)
      # default: the catalog's first instance of the GPU holding whole engines
      instance_type = optional(string)
      # GPUs of an instance type the catalog does not know (the catalog's wins otherwise)
      gpus_per_host     = optional(number)
      tensor_parallel   = optional(number, 1)
      pipeline_parallel = optional(number, 1)
      # what each engine runs: args without --host/--port (each engine gets its own port);
      # hf_token: where hosts read the Hugging Face token at engine start (never user data)
      engine = optional(object({
        kind  = string
        image = string
        args  = optional(list(string), [])
        hf_token = optional(object({
          source = string
          name   = string
        }))
      }))
    }))
  }))

  validation {
    condition     = alltrue([for r in values(var.regions) : length(r.azs) >= 3 && length(distinct(r.azs)) == length(r.azs)])
    error_message = "Every region needs at least 3 distinct availability zones: one Consul server in each."
  }

  validation {
    condition     = length(distinct([for r in values(var.regions) : r.cidr_index])) == length(var.regions)
    error_message = "cidr_index must be unique per region (it picks the region's /16)."
  }

  validation {
    condition     = alltrue([for r in values(var.regions) : r.cidr_index >= 0 && r.cidr_index < 64])
    error_message = "cidr_index must be in 0..63 (64 /16 blocks in the /10 supernet)."
  }

  validation {
    condition     = alltrue(flatten([for r in values(var.regions) : [for p in r.gpu_pools : p.tensor_parallel >= 1 && p.pipeline_parallel >= 1 && floor(p.tensor_parallel) == p.tensor_parallel && floor(p.pipeline_parallel) == p.pipeline_parallel]]))
    error_message = "gpu_pools[].tensor_parallel and pipeline_parallel are whole numbers >= 1: ${join(", ", flatten([for name, r in var.regions : [for i, p in r.gpu_pools : "${name}/${coalesce(p.name, "${lower(p.gpu)}-${i}")}" if !(p.tensor_parallel >= 1 && p.pipeline_parallel >= 1 && floor(p.tensor_parallel) == p.tensor_parallel && floor(p.pipeline_parallel) == p.pipeline_parallel)]]))}."
  }

  validation {
    condition     = alltrue(flatten([for r in values(var.regions) : [for p in r.gpu_pools : p.engine == null || try(contains(["vllm", "sglang"], p.engine.kind), false)]]))
    error_message = "gpu_pools[].engine.kind must be vllm or sglang: ${join(", ", flatten([for name, r in var.regions : [for i, p in r.gpu_pools : "${name}/${coalesce(p.name, "${lower(p.gpu)}-${i}")}" if !(p.engine == null || try(contains(["vllm", "sglang"], p.engine.kind), false))]]))}."
  }

  validation {
    condition     = alltrue(flatten([for r in values(var.regions) : [for p in r.gpu_pools : try(p.engine.hf_token == null, true) || try(contains(["secretsmanager", "ssm"], p.engine.hf_token.source) && length(p.engine.hf_token.name) > 0, false)]]))
    error_message = "gpu_pools[].engine.hf_token.source must be secretsmanager or ssm, with a name: ${join(", ", flatten([for name, r in var.regions : [for i, p in r.gpu_pools : "${name}/${coalesce(p.name, "${lower(p.gpu)}-${i}")}" if !(try(p.engine.hf_token == null, true) || try(contains(["secretsmanager", "ssm"], p.engine.hf_token.source) && length(p.engine.hf_token.name) > 0, false))]]))}."
  }
}

variable "supernet" {
  description = "Address space for all regions; each region gets the /16 at its cidr_index, so VPCs never overlap and can be peered for Consul WAN federation."
  type        = string
  default     = "10.64.0.0/10"

  validation {
    condition     = can(cidrhost(var.supernet, 0)) && tonumber(split("/", var.supernet)[1]) <= 10
    error_message = "supernet must be a CIDR block of size /10 or larger."
  }
}

variable "consul_servers_per_region" {
  description = "Consul servers per region, one per availability zone (3 tolerates the loss of one)."
  type        = number
  default     = 3

  validation {
    condition     = contains([3, 5], var.consul_servers_per_region)
    error_message = "Use 3 or 5 Consul servers: an odd quorum."
  }
}
