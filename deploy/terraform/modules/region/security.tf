# Least privilege. Consul ports: only inside the VPC, and WAN (8300, 8302) between federated
# servers. Engines (8000 + i) and their agents' load streams (7070 + 2i), for each engine i a
# host of the region runs: only from routers. Admin and metrics ports: only from
# admin_cidrs. The load balancer's API port is the only one clients reach.

locals {
  consul_lan = [
    { port = 8301, protocol = "tcp", what = "Serf LAN gossip" },
    { port = 8301, protocol = "udp", what = "Serf LAN gossip" },
  ]
  consul_wan = [
    { port = 8300, protocol = "tcp", what = "server RPC (cross-datacenter)" },
    { port = 8302, protocol = "tcp", what = "Serf WAN gossip" },
    { port = 8302, protocol = "udp", what = "Serf WAN gossip" },
  ]
  wan_rules = {
    for pair in setproduct(var.wan_peer_cidrs, local.consul_wan) :
    "${pair[0]}-${pair[1].port}-${pair[1].protocol}" => { cidr = pair[0], rule = pair[1] }
  }
  # the ports fleet-plan gave each engine of the region's hosts: its engine's and its agent's
  # load stream (the agent's admin port listens on loopback)
  engine_ports      = toset(flatten([for g in values(var.gpu_node_groups) : [for e in g.engines : tostring(e.port)]]))
  load_stream_ports = toset(flatten([for g in values(var.gpu_node_groups) : [for e in g.engines : tostring(e.load_stream_port)]]))
  admin_rules = {
    # 9090: router and global-tier metrics and admin; 7071: agent admin (loopback by default)
    for pair in setproduct(var.admin_cidrs, [7071, 9090, 9100]) : "${pair[0]}-${pair[1]}" => { cidr = pair[0], port = pair[1] }
  }
}

resource "aws_security_group" "consul_server" {
  name_prefix = "gpuroute-${var.name}-consul-"
  description = "Consul servers of ${var.name}"
  vpc_id      = aws_vpc.this.id
  tags        = local.tags
}

resource "aws_security_group" "node" {
  name_prefix = "gpuroute-${var.name}-node-"
  description = "Every gpuroute host of ${var.name} (Consul client agents)"
  vpc_id      = aws_vpc.this.id
  tags        = local.tags
}

resource "aws_security_group" "gpu" {
  name_prefix = "gpuroute-${var.name}-gpu-"
  description = "GPU hosts: engine and gpuroute agent"
  vpc_id      = aws_vpc.this.id
  tags        = local.tags
}

resource "aws_security_group" "router" {
  name_prefix = "gpuroute-${var.name}-router-"
  description = "Regional and global routers"
  vpc_id      = aws_vpc.this.id
  tags        = local.tags
}

resource "aws_security_group" "lb" {
  name_prefix = "gpuroute-${var.name}-lb-"
  description = "Network load balancer in front of the routers: the public API"
  vpc_id      = aws_vpc.this.id
  tags        = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "consul_rpc_in_region" {
  security_group_id = aws_security_group.consul_server.id
  description       = "Consul server RPC from agents in the region"
  cidr_ipv4         = var.vpc_cidr
  ip_protocol       = "tcp"
  from_port         = 8300
  to_port           = 8300
}

resource "aws_vpc_security_group_ingress_rule" "consul_http_in_region" {
  security_group_id = aws_security_group.consul_server.id
  description       = "Consul HTTP API from the region (routers, global tier discovery)"
  cidr_ipv4         = var.vpc_cidr
  ip_protocol       = "tcp"
  from_port         = 8500
  to_port           = 8500
}

resource "aws_vpc_security_group_ingress_rule" "consul_lan" {
  for_each          = { for r in local.consul_lan : "${r.port}-${r.protocol}" => r }
  security_group_id = aws_security_group.node.id
  description       = "Consul ${each.value.what} inside the region"
  cidr_ipv4         = var.vpc_cidr
  ip_protocol       = each.value.protocol
  from_port         = each.value.port
  to_port           = each.value.port
}

resource "aws_vpc_security_group_ingress_rule" "consul_wan" {
  for_each          = local.wan_rules
  security_group_id = aws_security_group.consul_server.id
  description       = "Consul ${each.value.rule.what} from a federated region's servers"
  cidr_ipv4         = each.value.cidr
  ip_protocol       = each.value.rule.protocol
  from_port         = each.value.rule.port
  to_port           = each.value.rule.port
}

resource "aws_vpc_security_group_ingress_rule" "engine_from_routers" {
  for_each                     = local.engine_ports
  security_group_id            = aws_security_group.gpu.id
  description                  = "Inference engine on ${each.key} (OpenAI API) from routers only"
  referenced_security_group_id = aws_security_group.router.id
  ip_protocol                  = "tcp"
  from_port                    = each.key
  to_port                      = each.key
}

resource "aws_vpc_security_group_ingress_rule" "load_stream_from_routers" {
  for_each                     = local.load_stream_ports
  security_group_id            = aws_security_group.gpu.id
  description                  = "gpuroute agent's load stream (gRPC) on ${each.key} from routers only"
  referenced_security_group_id = aws_security_group.router.id
  ip_protocol                  = "tcp"
  from_port                    = each.key
  to_port                      = each.key
}

resource "aws_vpc_security_group_ingress_rule" "admin" {
  for_each          = local.admin_rules
  security_group_id = aws_security_group.node.id
  description       = "Admin and metrics from operator networks only"
  cidr_ipv4         = each.value.cidr
  ip_protocol       = "tcp"
  from_port         = each.value.port
  to_port           = each.value.port
}

resource "aws_vpc_security_group_ingress_rule" "router_from_lb" {
  security_group_id            = aws_security_group.router.id
  description                  = "Router API from the load balancer"
  referenced_security_group_id = aws_security_group.lb.id
  ip_protocol                  = "tcp"
  from_port                    = 8080
  to_port                      = 8090
}

resource "aws_vpc_security_group_ingress_rule" "api" {
  for_each          = toset(var.client_cidrs)
  security_group_id = aws_security_group.lb.id
  description       = "Inference API (the only port clients reach)"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = var.tls_certificate_arn == null ? 80 : 443
  to_port           = var.tls_certificate_arn == null ? 80 : 443
}

resource "aws_vpc_security_group_egress_rule" "all" {
  for_each          = { consul = aws_security_group.consul_server.id, node = aws_security_group.node.id, gpu = aws_security_group.gpu.id, router = aws_security_group.router.id, lb = aws_security_group.lb.id }
  security_group_id = each.value
  description       = "Outbound (packages and images through NAT; peers inside the VPC)"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "-1"
}
