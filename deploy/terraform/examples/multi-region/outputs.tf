output "global_endpoint" {
  description = "The one endpoint for the world."
  value       = module.global.endpoint
}

output "regional_endpoints" {
  description = "Each region's router load balancer (for direct, in-region clients)."
  value       = { for name, m in local.regions_built : name => m.router_endpoint.dns_name }
}

output "failover_order" {
  description = "Where each region's traffic goes when it is down, nearest first."
  value       = module.plan.failover_order
}
