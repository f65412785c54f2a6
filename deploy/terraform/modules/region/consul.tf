data "aws_region" "current" {}

# Three (or five) Consul servers, one per availability zone, at fixed private IPs. They find
# each other by tag (cloud auto-join); other regions WAN-join them by IP.

locals {
  consul_common = {
    datacenter     = var.name
    auto_join      = "provider=aws tag_key=gpuroute-consul tag_value=${local.auto_join_tag}"
    consul_version = var.consul_version
    aws_region     = data.aws_region.current.name
    ssm_prefix     = local.ssm_prefix
  }
  # templatefile cannot nest: the client-agent snippet is rendered once and passed in
  consul_client = templatefile("${path.module}/templates/consul-client.sh.tftpl", local.consul_common)
}

resource "aws_instance" "consul_server" {
  count                  = length(var.consul_servers)
  ami                    = var.ami_id
  instance_type          = var.consul_instance_type
  availability_zone      = var.consul_servers[count.index].az
  subnet_id              = aws_subnet.private[index(var.azs, var.consul_servers[count.index].az)].id
  private_ip             = var.consul_servers[count.index].private_ip
  vpc_security_group_ids = [aws_security_group.consul_server.id, aws_security_group.node.id]
  iam_instance_profile   = aws_iam_instance_profile.host["consul_server"].name

  user_data_base64 = base64gzip(templatefile("${path.module}/templates/consul-server.sh.tftpl", merge(local.consul_common, {
    node_name = var.consul_servers[count.index].name
    servers   = length(var.consul_servers)
    wan_join  = var.wan_join
  })))

  metadata_options {
    http_tokens = "required"
  }

  root_block_device {
    encrypted   = true
    volume_size = 40
  }

  tags = merge(local.tags, {
    Name              = var.consul_servers[count.index].name
    "gpuroute-consul" = local.auto_join_tag
  })

  lifecycle {
    # a changed user-data must not replace a quorum member behind the operator's back:
    # roll servers one at a time (docs/deploy.md)
    ignore_changes = [user_data_base64, ami]
  }
}
