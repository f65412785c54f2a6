output "groups" {
  description = "Per node group: the model pool its hosts serve (the routers' `pool` label; null for a fixed group serving several models), the auto-scaling group's bounds and size at creation, its warm pool (null without standby hosts) and its scaling policy (null when min = max), which follows that pool's desired backends."
  value = {
    for key, g in local.groups : key => {
      pool             = g.pool
      min_size         = g.min
      max_size         = g.max
      desired_capacity = g.desired
      # Running: a standby host has its engine up with the model loaded and its agent in
      # standby (the lifecycle watcher), so joining takes seconds, not a model load. Hosts
      # leave through the terminating hook (a drain), never back into the pool: reuse
      # would skip the hook. Prepared capacity min + standby keeps standby warm hosts
      # whatever the desired size (warm = max(min_size, prepared - desired)).
      warm_pool = g.standby == 0 ? null : {
        pool_state                  = "Running"
        min_size                    = g.standby
        max_group_prepared_capacity = g.min + g.standby
        reuse_on_scale_in           = false
      }
      scaling_policy = g.min == g.max ? null : {
        name                      = "follow-desired-backends"
        policy_type               = "TargetTrackingScaling"
        target_value              = 1
        estimated_instance_warmup = var.instance_warmup_s
        # the desired backends of the group's model: an autoscaling group serves exactly
        # one, and no other group of its region serves it (variables.tf)
        desired = {
          id          = "desired"
          namespace   = var.metric_namespace
          metric_name = local.metric_name
          dimensions  = { pool = g.pool }
          stat        = "Maximum"
        }
        # its AutoScalingGroupName dimension is the group's name, known to modules/region
        in_service = {
          id          = "in_service"
          namespace   = "AWS/AutoScaling"
          metric_name = "GroupInServiceInstances"
          stat        = "Average"
        }
        expression = g.expression
      }
    }
  }
}

output "metric" {
  description = "The metric the policies follow, as the routers' CloudWatch agent publishes it: namespace, name, and its one dimension."
  value       = { namespace = var.metric_namespace, name = local.metric_name, dimension = "pool" }
}

output "enabled_metrics" {
  description = "Group metrics every GPU auto-scaling group publishes (1-minute granularity); the policy reads GroupInServiceInstances."
  value       = local.enabled_metrics
}

output "lifecycle_hook" {
  description = "The terminating hook of every GPU group: the host's lifecycle watcher drains the agent, then completes the hook; CONTINUE after the heartbeat timeout if it never does."
  value = {
    name                 = "gpuroute-drain"
    lifecycle_transition = "autoscaling:EC2_INSTANCE_TERMINATING"
    heartbeat_timeout    = max(30, ceil(var.drain.timeout_s + var.drain.grace_s + var.drain.margin_s))
    default_result       = "CONTINUE"
  }
}
