# Regional routers (and, when global_routers > 0, the global tier's routers in this region)
# behind a network load balancer. The API listens on 8080 (global: 8090); metrics and admin
# on 9090 (admin_listen), where the load balancer's /readyz health check goes too.

locals {
  router_roles = merge(
    { regional = { port = 8080, count = var.routers, command = "router" } },
    var.global_routers > 0 ? {
      global = { port = 8090, count = { min = var.global_routers, desired = var.global_routers, max = var.global_routers }, command = "global" }
    } : {}
  )
}

# requirements.lock is too big for user data (EC2 takes 16 KB): routers and GPU hosts
# download it from the operator's store, next to the wheel unless gpuroute_requirements_url
# says otherwise, and check it against this repository's own before pip reads it.
locals {
  # templatefile cannot nest: snippets the host templates share are rendered once, as
  # consul_client is, and passed in
  install_gpuroute = templatefile("${path.module}/templates/install-gpuroute.sh.tftpl", {
    requirements_url    = coalesce(var.gpuroute_requirements_url, replace(var.gpuroute_package, "/[^/]*$/", "requirements.lock"))
    requirements_sha256 = filesha256("${path.module}/../../../../requirements.lock")
    gpuroute            = var.gpuroute_package
  })
  gpu_types_toml = templatefile("${path.module}/templates/gpu-types.toml.tftpl", { gpu_types = var.gpu_types })
}

resource "aws_launch_template" "router" {
  for_each               = local.router_roles
  name_prefix            = "gpuroute-${var.name}-${each.key}-"
  image_id               = var.ami_id
  instance_type          = var.router_instance_type
  vpc_security_group_ids = [aws_security_group.node.id, aws_security_group.router.id]

  iam_instance_profile {
    name = aws_iam_instance_profile.host[each.key].name
  }

  metadata_options {
    http_tokens = "required"
  }

  user_data = base64gzip(templatefile("${path.module}/templates/${each.key == "global" ? "global" : "router"}.sh.tftpl", merge(local.consul_common, {
    consul_client    = local.consul_client
    region           = var.name
    jurisdiction     = var.jurisdiction
    port             = each.value.port
    install_gpuroute = local.install_gpuroute
    drain_timeout_s  = var.drain_timeout_s
    api_keys         = var.api_keys
    allow_anonymous  = var.allow_anonymous_api
    regions_toml     = var.regions_toml
    gpu_types_toml   = local.gpu_types_toml
    models           = var.models
    # the global tier's hosts (this VPC and its peers) forward clients to the routers
    trusted_proxies = concat([var.vpc_cidr], var.wan_peer_cidrs)
    unit            = file("${path.module}/../../../systemd/gpuroute-${each.value.command}.service")
    # regional routers publish the GPU groups' scaling metric (the global tier does not)
    metrics_log_group        = aws_cloudwatch_log_group.router_metrics.name
    metric_namespace         = module.autoscaling.metric.namespace
    cloudwatch_agent_version = var.cloudwatch_agent_version
  })))

  lifecycle {
    precondition {
      condition     = length(var.api_keys) > 0 || var.allow_anonymous_api
      error_message = "List api_keys (sha256 of each key), or set allow_anonymous_api = true to serve without keys."
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(local.tags, { Name = "gpuroute-${var.name}-${each.key}-router", "gpuroute:role" = "${each.key}-router" })
  }
}

# The regional routers' CloudWatch agent writes gpuroute_pool_desired_backends here as
# embedded metric format logs; CloudWatch extracts the metric the GPU groups' policies read.
resource "aws_cloudwatch_log_group" "router_metrics" {
  name              = "/gpuroute/${var.name}/router-metrics"
  retention_in_days = 7
  tags              = local.tags
}

resource "aws_lb" "router" {
  for_each           = local.router_roles
  name_prefix        = substr("gr${each.key}", 0, 6)
  load_balancer_type = "network"
  # Regional routers take traffic from the global tier only (inside the fleet's networks);
  # only the global tier's load balancer faces the internet.
  internal        = each.key != "global"
  subnets         = each.key == "global" ? aws_subnet.public[*].id : aws_subnet.private[*].id
  security_groups = [aws_security_group.lb.id]
  tags            = local.tags
}

resource "aws_lb_target_group" "router" {
  for_each             = local.router_roles
  name_prefix          = substr("gr${each.key}", 0, 6)
  port                 = each.value.port
  protocol             = "TCP"
  vpc_id               = aws_vpc.this.id
  deregistration_delay = var.drain_timeout_s

  health_check {
    protocol            = "HTTP"
    port                = "9090"
    path                = "/readyz"
    interval            = 10
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  tags = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "health_from_lb" {
  security_group_id            = aws_security_group.router.id
  description                  = "Load balancer health checks on the router's admin listener (/readyz)"
  referenced_security_group_id = aws_security_group.lb.id
  ip_protocol                  = "tcp"
  from_port                    = 9090
  to_port                      = 9090
}

resource "aws_lb_listener" "api" {
  for_each          = local.router_roles
  load_balancer_arn = aws_lb.router[each.key].arn
  port              = var.tls_certificate_arn == null ? 80 : 443
  protocol          = var.tls_certificate_arn == null ? "TCP" : "TLS"
  certificate_arn   = var.tls_certificate_arn
  ssl_policy        = var.tls_certificate_arn == null ? null : "ELBSecurityPolicy-TLS13-1-2-2021-06"

  lifecycle {
    precondition {
      condition     = var.tls_certificate_arn != null || var.allow_plaintext_api
      error_message = "Set tls_certificate_arn (the API is served over TLS on 443), or allow_plaintext_api = true to serve plain TCP on port 80."
    }
  }

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.router[each.key].arn
  }
}

resource "aws_autoscaling_group" "router" {
  for_each            = local.router_roles
  name_prefix         = "gpuroute-${var.name}-${each.key}-"
  min_size            = each.value.count.min
  max_size            = each.value.count.max
  desired_capacity    = each.value.count.desired
  vpc_zone_identifier = aws_subnet.private[*].id
  target_group_arns   = [aws_lb_target_group.router[each.key].arn]
  health_check_type   = "ELB"

  launch_template {
    id      = aws_launch_template.router[each.key].id
    version = aws_launch_template.router[each.key].latest_version
  }

  instance_refresh {
    strategy = "Rolling"
    preferences {
      min_healthy_percentage = 50
      instance_warmup        = 120
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
