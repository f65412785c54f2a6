output "vpc_id" {
  description = "The region's VPC."
  value       = aws_vpc.this.id
}

output "private_route_table_id" {
  description = "Route table of the private subnets (peering routes for WAN federation go here)."
  value       = aws_route_table.private.id
}

output "consul_server_ips" {
  description = "Private IPs of the region's Consul servers."
  value       = aws_instance.consul_server[*].private_ip
}

output "router_endpoint" {
  description = "DNS name and hosted zone of the regional routers' load balancer."
  value       = { dns_name = aws_lb.router["regional"].dns_name, zone_id = aws_lb.router["regional"].zone_id }
}

output "global_endpoint" {
  description = "DNS name and hosted zone of this region's global-tier load balancer (null without global routers)."
  value       = var.global_routers > 0 ? { dns_name = aws_lb.router["global"].dns_name, zone_id = aws_lb.router["global"].zone_id } : null
}
