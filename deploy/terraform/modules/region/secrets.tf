# Secrets live in SSM Parameter Store (SecureString), never in user data: each host's role may
# read only the parameters it needs, and fetches them at boot (templates: `secret NAME`).

locals {
  ssm_prefix = "/gpuroute/${var.name}"
  secrets = {
    "consul/gossip-key"      = var.consul_gossip_key
    "consul/bootstrap-token" = var.consul_acl_bootstrap_token
    "consul/agent-token"     = var.consul_agent_token
    "consul/engine-token"    = var.consul_engine_token
    "consul/router-token"    = var.consul_router_token
    "consul/global-token"    = var.consul_global_token
    "consul/ca"              = var.consul_ca_pem
    "consul/server-cert"     = var.consul_server_cert_pem
    "consul/server-key"      = var.consul_server_key_pem
    "gpuroute/decision-key"  = var.residency_decision_key
    "gpuroute/admin-token"   = var.admin_token
    # agents' load streams: agents and routers prove they hold it (gpuroute/load_auth.py)
    "gpuroute/load-stream-token" = var.load_stream_token
  }
  # which parameters each kind of host reads
  secret_readers = {
    consul_server = ["consul/gossip-key", "consul/bootstrap-token", "consul/ca", "consul/server-cert", "consul/server-key"]
    gpu           = ["consul/gossip-key", "consul/agent-token", "consul/engine-token", "consul/ca", "gpuroute/load-stream-token"]
    regional      = ["consul/gossip-key", "consul/agent-token", "consul/router-token", "consul/ca", "gpuroute/decision-key", "gpuroute/admin-token", "gpuroute/load-stream-token"]
    global        = ["consul/gossip-key", "consul/agent-token", "consul/global-token", "consul/ca", "gpuroute/decision-key", "gpuroute/admin-token"]
  }
}

resource "aws_ssm_parameter" "secret" {
  # the names alone, which are not secret (for_each may not iterate a sensitive value)
  for_each = toset(["consul/gossip-key", "consul/bootstrap-token", "consul/agent-token", "consul/engine-token", "consul/router-token", "consul/global-token", "consul/ca", "consul/server-cert", "consul/server-key", "gpuroute/decision-key", "gpuroute/admin-token", "gpuroute/load-stream-token"])
  name     = "${local.ssm_prefix}/${each.key}"
  type     = "SecureString"
  value    = local.secrets[each.key]
  tags     = local.tags
}
