# Inter-region VPC peering between two federating regions, so their Consul servers can WAN
# gossip (8302) and forward RPC (8300) over private addresses. Security groups still only
# admit the peer's CIDR on those ports (region module, wan_peer_cidrs).

resource "aws_vpc_peering_connection" "this" {
  provider    = aws.requester
  vpc_id      = var.requester.vpc_id
  peer_vpc_id = var.accepter.vpc_id
  peer_region = var.accepter.aws_region
  tags        = merge(var.tags, { Name = "gpuroute-${var.requester.name}-${var.accepter.name}" })
}

resource "aws_vpc_peering_connection_accepter" "this" {
  provider                  = aws.accepter
  vpc_peering_connection_id = aws_vpc_peering_connection.this.id
  auto_accept               = true
  tags                      = merge(var.tags, { Name = "gpuroute-${var.requester.name}-${var.accepter.name}" })
}

resource "aws_route" "requester" {
  provider                  = aws.requester
  route_table_id            = var.requester.route_table_id
  destination_cidr_block    = var.accepter.cidr
  vpc_peering_connection_id = aws_vpc_peering_connection.this.id
}

resource "aws_route" "accepter" {
  provider                  = aws.accepter
  route_table_id            = var.accepter.route_table_id
  destination_cidr_block    = var.requester.cidr
  vpc_peering_connection_id = aws_vpc_peering_connection_accepter.this.id
}
