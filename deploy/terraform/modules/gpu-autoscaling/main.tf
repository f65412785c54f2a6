# Pure logic, no provider: how each GPU node group scales, planned and tested offline
# (`terraform test`). modules/region turns these values into the AWS resources.
#
# The policy is target tracking on metric math: the routers' desired backends for the pool
# (Maximum: every router of a region exports the same number, agreed through Redis) divided
# by the group's hosts in service, with target 1.0. Target tracking moves capacity in
# proportion to the metric, so the group's capacity follows the desired size, clamped to
# [min, max], through one rule; step scaling would need one step per possible size.
#
# A pool is a model: the routers export gpuroute_pool_desired_backends{pool="<model>"}, the
# backends (engines) that should be in rotation for that model in the region. A host runs
# engines_per_host of them (two TP4 engines on an 8-GPU host), so the policy divides by the
# engines in service: hosts in service x engines_per_host. An autoscaling group serves one
# model and no other group of its region serves it (variables.tf): two groups would each
# grow to the whole pool. Warm standby hosts are the group's static standby_hosts.

locals {
  metric_name = "gpuroute_pool_desired_backends"
  # the policy divides by GroupInServiceInstances; the others are for dashboards
  enabled_metrics = [
    "GroupInServiceInstances", "GroupDesiredCapacity", "GroupMinSize", "GroupMaxSize",
    "GroupPendingInstances", "GroupTerminatingInstances", "WarmPoolWarmedCapacity",
    "WarmPoolDesiredCapacity", "WarmPoolPendingCapacity",
  ]

  groups = {
    for key, g in var.node_groups : key => {
      # the model pool the group's hosts serve, the `pool` label the routers export
      # (`llama-3.1-8b`); null for a fixed group serving several models (it has no policy)
      pool    = length(distinct(g.models)) == 1 ? g.models[0] : null
      min     = coalesce(g.min_hosts, g.hosts)
      max     = coalesce(g.max_hosts, g.hosts)
      desired = g.hosts
      standby = g.standby_hosts
      # desired engines / engines in service
      expression = "desired / (in_service * ${g.engines_per_host})"
    }
  }
}
