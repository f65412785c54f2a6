# One auto-scaling group per GPU pool. Each host runs the pool's engines (several when the
# host's GPUs hold several: each on its own GPUs and port), a Consul client agent, one
# `gpuroute agent` per engine and the lifecycle watcher as systemd services (user data).
# How each group scales is modules/gpu-autoscaling's (provider-free, `terraform test`ed);
# the drain hook and the scaling policies are in autoscaling.tf.

module "autoscaling" {
  source      = "../gpu-autoscaling"
  node_groups = var.gpu_node_groups
  # the agent's drain_grace_s is its default (1 s): agent.toml below does not set it
  drain = { timeout_s = var.drain_timeout_s }
}

resource "aws_launch_template" "gpu" {
  for_each               = var.gpu_node_groups
  name_prefix            = "gpuroute-${var.name}-${replace(each.key, "/", "-")}-"
  image_id               = var.gpu_ami_id
  instance_type          = each.value.instance_type
  vpc_security_group_ids = [aws_security_group.node.id, aws_security_group.gpu.id]

  iam_instance_profile {
    name = aws_iam_instance_profile.host["gpu"].name
  }

  metadata_options {
    http_tokens = "required"
  }

  user_data = base64gzip(templatefile("${path.module}/templates/gpu-node.sh.tftpl", merge(local.consul_common, {
    consul_client     = local.consul_client
    region            = var.name
    pool              = each.value.name
    zone              = each.value.az
    gpu               = each.value.gpu
    models            = each.value.models
    tensor_parallel   = each.value.tensor_parallel
    pipeline_parallel = each.value.pipeline_parallel
    capacity          = each.value.capacity
    engine            = each.value.engine
    engines           = each.value.engines
    gpu_types_toml    = local.gpu_types_toml
    install_gpuroute  = local.install_gpuroute
    drain_timeout_s   = var.drain_timeout_s
    agent_unit        = file("${path.module}/../../../systemd/gpuroute-agent.service")
    lifecycle_hook    = module.autoscaling.lifecycle_hook.name
    lifecycle_watcher = file("${path.module}/files/gpuroute-lifecycle.sh")
  })))

  tag_specifications {
    resource_type = "instance"
    # gpuroute:pool: the model pool the host serves (none in a fixed group serving several)
    tags = merge(local.tags, {
      Name            = "gpuroute-${var.name}-${each.value.gpu}"
      "gpuroute:role" = "gpu"
    }, { for k, pool in { "gpuroute:pool" = module.autoscaling.groups[each.key].pool } : k => pool if pool != null })
  }
}

resource "aws_autoscaling_group" "gpu" {
  for_each            = var.gpu_node_groups
  name_prefix         = "gpuroute-${var.name}-${replace(each.key, "/", "-")}-"
  min_size            = module.autoscaling.groups[each.key].min_size
  max_size            = module.autoscaling.groups[each.key].max_size
  desired_capacity    = module.autoscaling.groups[each.key].desired_capacity
  vpc_zone_identifier = [aws_subnet.private[index(var.azs, each.value.az)].id]
  # the policy divides the pool's desired backends by GroupInServiceInstances
  enabled_metrics     = module.autoscaling.enabled_metrics
  metrics_granularity = "1Minute"

  launch_template {
    id      = aws_launch_template.gpu[each.key].id
    version = aws_launch_template.gpu[each.key].latest_version
  }

  # Standby hosts: running, engine loaded, agent in standby (the lifecycle watcher).
  dynamic "warm_pool" {
    for_each = module.autoscaling.groups[each.key].warm_pool[*]
    content {
      pool_state                  = warm_pool.value.pool_state
      min_size                    = warm_pool.value.min_size
      max_group_prepared_capacity = warm_pool.value.max_group_prepared_capacity
      instance_reuse_policy {
        reuse_on_scale_in = warm_pool.value.reuse_on_scale_in
      }
    }
  }

  # A host leaving the group waits in the drain hook (autoscaling.tf) until its agent has
  # drained; systemd's SIGTERM drains it again on the way down.
  instance_refresh {
    strategy = "Rolling"
    preferences {
      min_healthy_percentage = 90
      instance_warmup        = 600
    }
  }

  dynamic "tag" {
    for_each = local.tags
    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }

  lifecycle {
    # hosts is the size at creation; then the scaling policy owns the desired capacity
    # (AWS moves it into new bounds when min or max change)
    ignore_changes = [desired_capacity]
  }
}
