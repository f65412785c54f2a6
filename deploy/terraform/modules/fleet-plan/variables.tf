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
      gpu    = string
      count  = number
      models = list(string)
      zone   = optional(string)
      # in hosts; null = hosts (a fixed group); modules/gpu-autoscaling checks them
      min_hosts     = optional(number)
      max_hosts     = optional(number)
      standby_hosts = optional(number, 0)
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
    condition     = alltrue(flatten([for r in values(var.regions) : [for p in r.gpu_pools : contains(["H100", "A100", "L4", "T4", "V100"], p.gpu)]]))
    error_message = "gpu_pools[].gpu must be one of H100, A100, L4, T4, V100."
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
