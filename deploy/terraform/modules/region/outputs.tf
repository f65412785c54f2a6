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

output "gpu_groups" {
  description = "Per GPU node group: the instance type its hosts launch as, the auto-scaling group's bounds, and the engines each host runs (index, engine port, GPUs, the agent's load-stream and admin ports)."
  value = {
    for k, g in var.gpu_node_groups : k => {
      instance_type = aws_launch_template.gpu[k].instance_type
      min_size      = aws_autoscaling_group.gpu[k].min_size
      max_size      = aws_autoscaling_group.gpu[k].max_size
      warm_pool     = module.autoscaling.groups[k].warm_pool
      engines       = g.engines
    }
  }
}

output "gpu_token_arns" {
  description = "The Hugging Face token secrets GPU hosts may read (their pools name them), by source: secretsmanager, ssm."
  value       = local.hf_token_arns
}

output "engine_ports" {
  description = "The ports routers may reach on GPU hosts: each engine's, and each agent's load stream."
  value = {
    engine      = sort([for r in aws_vpc_security_group_ingress_rule.engine_from_routers : tostring(r.from_port)])
    load_stream = sort([for r in aws_vpc_security_group_ingress_rule.load_stream_from_routers : tostring(r.from_port)])
  }
}
