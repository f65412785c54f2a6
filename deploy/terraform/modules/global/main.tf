# One name for the world: Route 53 latency-based records, one per region's global-tier load
# balancer, each with a health check so a failing region leaves DNS within ~30 s. Inside the
# global tier, gpuroute's own residency, spillover and failover take over.

resource "aws_route53_health_check" "global" {
  for_each          = var.endpoints
  fqdn              = each.value.dns_name
  port              = var.health_check.port
  type              = var.health_check.protocol
  resource_path     = var.health_check.path
  failure_threshold = var.health_check.failure_threshold
  request_interval  = var.health_check.request_interval
  tags              = merge(var.tags, { Name = "gpuroute-global-${each.key}" })
}

resource "aws_route53_record" "global" {
  for_each        = var.endpoints
  zone_id         = var.hosted_zone_id
  name            = var.domain_name
  type            = "A"
  set_identifier  = "gpuroute-${each.key}"
  health_check_id = aws_route53_health_check.global[each.key].id

  latency_routing_policy {
    region = each.value.aws_region
  }

  alias {
    name                   = each.value.dns_name
    zone_id                = each.value.zone_id
    evaluate_target_health = true
  }
}
