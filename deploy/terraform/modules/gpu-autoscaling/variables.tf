variable "node_groups" {
  description = "GPU node groups keyed `<region>/<group>` (fleet-plan's gpu_node_groups: `eu-west/l4-1`): hosts is the size at creation; min_hosts and max_hosts bound the group (both default to hosts: a fixed group); standby_hosts are warm hosts kept ready to join it; models are the models its hosts serve. A group autoscales when max_hosts is above min_hosts or it has standby hosts: then it serves exactly one model, and no other group of its region serves that model (its policy follows the routers' desired backends for that model's whole pool)."
  type = map(object({
    models        = list(string)
    hosts         = number
    min_hosts     = optional(number)
    max_hosts     = optional(number)
    standby_hosts = optional(number, 0)
    # engines each host runs (fleet-plan's packing): the policy counts engines in service
    engines_per_host = optional(number, 1)
  }))

  validation {
    condition     = length([for k, g in var.node_groups : k if anytrue([for n in [g.hosts, g.min_hosts, g.max_hosts, g.standby_hosts] : n != floor(n) if n != null])]) == 0
    error_message = "hosts, min_hosts, max_hosts and standby_hosts are whole numbers of hosts: ${join(", ", [for k, g in var.node_groups : k if anytrue([for n in [g.hosts, g.min_hosts, g.max_hosts, g.standby_hosts] : n != floor(n) if n != null])])}."
  }

  validation {
    # target tracking scales in proportion to the hosts in service: from zero it cannot
    condition     = length([for k, g in var.node_groups : k if coalesce(g.min_hosts, g.hosts) < 1]) == 0
    error_message = "min_hosts must be at least 1 (the scaling policy divides by the hosts in service, so a group cannot scale out from zero): ${join(", ", [for k, g in var.node_groups : k if coalesce(g.min_hosts, g.hosts) < 1])}."
  }

  validation {
    condition     = length([for k, g in var.node_groups : k if coalesce(g.min_hosts, g.hosts) > coalesce(g.max_hosts, g.hosts)]) == 0
    error_message = "min_hosts must not exceed max_hosts (each defaults to hosts, the pool's GPU count in whole hosts): ${join(", ", [for k, g in var.node_groups : k if coalesce(g.min_hosts, g.hosts) > coalesce(g.max_hosts, g.hosts)])}."
  }

  validation {
    condition     = length([for k, g in var.node_groups : k if g.hosts < coalesce(g.min_hosts, g.hosts) || g.hosts > coalesce(g.max_hosts, g.hosts)]) == 0
    error_message = "hosts (the pool's GPU count in whole hosts, its size at creation) must lie between min_hosts and max_hosts: ${join(", ", [for k, g in var.node_groups : k if g.hosts < coalesce(g.min_hosts, g.hosts) || g.hosts > coalesce(g.max_hosts, g.hosts)])}."
  }

  validation {
    # a standby host only ever joins when the group grows: more than it can grow by is idle
    condition     = length([for k, g in var.node_groups : k if g.standby_hosts < 0 || g.standby_hosts > coalesce(g.max_hosts, g.hosts) - coalesce(g.min_hosts, g.hosts)]) == 0
    error_message = "standby_hosts must be between 0 and max_hosts - min_hosts (warm hosts beyond what the group can grow by would never serve): ${join(", ", [for k, g in var.node_groups : k if g.standby_hosts < 0 || g.standby_hosts > coalesce(g.max_hosts, g.hosts) - coalesce(g.min_hosts, g.hosts)])}."
  }

  validation {
    # the region is the key's prefix: the rules below compare groups within a region
    condition     = alltrue([for k in keys(var.node_groups) : can(regex("^[^/]+/[^/]+$", k))])
    error_message = "node_groups are keyed `<region>/<group>` as fleet-plan's gpu_node_groups (`eu-west/l4-1`): ${join(", ", [for k in keys(var.node_groups) : k if !can(regex("^[^/]+/[^/]+$", k))])}."
  }

  validation {
    # the policy's `pool` dimension is the model: the routers export
    # gpuroute_pool_desired_backends per model pool
    condition     = length([for k, g in var.node_groups : k if length(distinct(g.models)) != 1 && (coalesce(g.max_hosts, g.hosts) > coalesce(g.min_hosts, g.hosts) || g.standby_hosts > 0)]) == 0
    error_message = "An autoscaling group (max_hosts above min_hosts, or standby_hosts) serves exactly one model: its policy follows gpuroute_pool_desired_backends for that model's pool: ${join("; ", [for k, g in var.node_groups : "${k} serves ${length(g.models) == 0 ? "none" : join(", ", g.models)}" if length(distinct(g.models)) != 1 && (coalesce(g.max_hosts, g.hosts) > coalesce(g.min_hosts, g.hosts) || g.standby_hosts > 0)])}."
  }

  validation {
    # two groups on one model pool would each scale to the pool's whole desired size
    condition = length(flatten([
      for k, g in var.node_groups : [
        for k2, o in var.node_groups : k2
        if k2 != k && split("/", k2)[0] == split("/", k)[0] && length(setintersection(g.models, o.models)) > 0
      ] if coalesce(g.max_hosts, g.hosts) > coalesce(g.min_hosts, g.hosts) || g.standby_hosts > 0
    ])) == 0
    error_message = "No other GPU group of its region may serve the model of an autoscaling group (each would follow the desired backends of the model's whole pool): ${join("; ", distinct(flatten([
      for k, g in var.node_groups : [
        for k2, o in var.node_groups : "${join(" and ", sort([k, k2]))} both serve ${join(", ", sort(setintersection(g.models, o.models)))}"
        if k2 != k && split("/", k2)[0] == split("/", k)[0] && length(setintersection(g.models, o.models)) > 0
      ] if coalesce(g.max_hosts, g.hosts) > coalesce(g.min_hosts, g.hosts) || g.standby_hosts > 0
    ])))}."
  }
}

variable "drain" {
  description = "The node agent's drain: timeout_s and grace_s as in its agent.toml (drain_timeout_s, drain_grace_s); margin_s covers the lifecycle watcher's polling and API calls. The terminating hook waits their sum before it gives up."
  type = object({
    timeout_s = number
    grace_s   = optional(number, 1)
    margin_s  = optional(number, 60)
  })

  validation {
    condition     = var.drain.timeout_s >= 0 && var.drain.grace_s >= 0 && var.drain.margin_s >= 30
    error_message = "drain.timeout_s and drain.grace_s must be >= 0, drain.margin_s >= 30 (the watcher polls every 5 s, then calls the Auto Scaling API)."
  }

  validation {
    condition     = var.drain.timeout_s + var.drain.grace_s + var.drain.margin_s <= 7200
    error_message = "drain.timeout_s + grace_s + margin_s must be at most 7200 s, the longest heartbeat timeout a lifecycle hook allows."
  }
}

variable "metric_namespace" {
  description = "CloudWatch namespace the routers' CloudWatch agent publishes gpuroute_pool_desired_backends under."
  type        = string
  default     = "gpuroute"
}

variable "instance_warmup_s" {
  description = "Seconds a newly started host takes to serve (image pull, model load): the policy's estimated instance warm-up."
  type        = number
  default     = 600

  validation {
    condition     = var.instance_warmup_s >= 0
    error_message = "instance_warmup_s must be >= 0."
  }
}
