output "endpoint" {
  description = "The global endpoint clients use."
  value       = var.domain_name
}

output "health_check_ids" {
  description = "Route 53 health check per region (alarm on them)."
  value       = { for k, h in aws_route53_health_check.global : k => h.id }
}
