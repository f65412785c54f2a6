# The GPU groups' drain hook and scaling policies, from modules/gpu-autoscaling's values.

resource "aws_autoscaling_lifecycle_hook" "drain" {
  for_each               = var.gpu_node_groups
  name                   = module.autoscaling.lifecycle_hook.name
  autoscaling_group_name = aws_autoscaling_group.gpu[each.key].name
  lifecycle_transition   = module.autoscaling.lifecycle_hook.lifecycle_transition
  # longer than the agent's drain: the watcher completes the hook once the host is empty
  heartbeat_timeout = module.autoscaling.lifecycle_hook.heartbeat_timeout
  default_result    = module.autoscaling.lifecycle_hook.default_result
}

# Target tracking at 1.0 on (the routers' desired backends for the pool) / (hosts in
# service): the group's capacity follows the desired size within its bounds.
resource "aws_autoscaling_policy" "desired_backends" {
  for_each               = { for k, g in module.autoscaling.groups : k => g.scaling_policy if g.scaling_policy != null }
  name                   = each.value.name
  autoscaling_group_name = aws_autoscaling_group.gpu[each.key].name
  policy_type            = each.value.policy_type

  estimated_instance_warmup = each.value.estimated_instance_warmup

  target_tracking_configuration {
    target_value     = each.value.target_value
    disable_scale_in = false

    customized_metric_specification {
      metrics {
        id          = each.value.desired.id
        return_data = false
        metric_stat {
          stat = each.value.desired.stat
          metric {
            namespace   = each.value.desired.namespace
            metric_name = each.value.desired.metric_name
            dynamic "dimensions" {
              for_each = each.value.desired.dimensions
              content {
                name  = dimensions.key
                value = dimensions.value
              }
            }
          }
        }
      }

      metrics {
        id          = each.value.in_service.id
        return_data = false
        metric_stat {
          stat = each.value.in_service.stat
          metric {
            namespace   = each.value.in_service.namespace
            metric_name = each.value.in_service.metric_name
            dimensions {
              name  = "AutoScalingGroupName"
              value = aws_autoscaling_group.gpu[each.key].name
            }
          }
        }
      }

      metrics {
        id          = "per_host"
        label       = "desired backends per host in service"
        expression  = each.value.expression
        return_data = true
      }
    }
  }
}
