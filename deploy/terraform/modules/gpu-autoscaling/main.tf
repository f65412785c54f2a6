# Pure logic, no provider: how each GPU node group scales, planned and tested offline
# (`terraform test`). modules/region turns these values into the AWS resources.
#
# The policy is target tracking on metric math: the routers' desired backends for the pool
# (Maximum: every router of a region exports the same number, agreed through Redis) divided
# by the group's hosts in service, with target 1.0. Target tracking moves capacity in
# proportion to the metric, so the group's capacity follows the desired size, clamped to
# [min, max], through one rule; step scaling would need one step per possible size.

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
      # the pool label the routers export: the group's name within its region (`h100-0`)
      pool    = reverse(split("/", key))[0]
      min     = coalesce(g.min_hosts, g.hosts)
      max     = coalesce(g.max_hosts, g.hosts)
      desired = g.hosts
      standby = g.standby_hosts
    }
  }
}
