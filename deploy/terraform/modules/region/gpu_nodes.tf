# One auto-scaling group per GPU pool. Each host runs the engine, a Consul client agent and
# `gpuroute agent` as systemd services (user-data installs them).

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
    zone              = each.value.az
    gpu               = each.value.gpu
    gpu_count         = each.value.gpus_per_host
    capacity          = each.value.capacity
    models            = each.value.models
    engine            = var.engine
    gpuroute          = var.gpuroute_package
    requirements_lock = file("${path.module}/../../../../requirements.lock")
    drain_timeout_s   = var.drain_timeout_s
    agent_unit        = file("${path.module}/../../../systemd/gpuroute-agent.service")
  })))

  tag_specifications {
    resource_type = "instance"
    tags          = merge(local.tags, { Name = "gpuroute-${var.name}-${each.value.gpu}", "gpuroute:role" = "gpu" })
  }
}

resource "aws_autoscaling_group" "gpu" {
  for_each            = var.gpu_node_groups
  name_prefix         = "gpuroute-${var.name}-${replace(each.key, "/", "-")}-"
  min_size            = each.value.hosts
  max_size            = each.value.hosts
  desired_capacity    = each.value.hosts
  vpc_zone_identifier = [aws_subnet.private[index(var.azs, each.value.az)].id]

  launch_template {
    id      = aws_launch_template.gpu[each.key].id
    version = aws_launch_template.gpu[each.key].latest_version
  }

  # An instance leaving the group gets SIGTERM through systemd: the agent drains first.
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
}
