# Renders the region module's user-data templates without any provider, so `terraform test`
# can check them offline (the AWS modules themselves need provider plugins to plan).

variable "drain_timeout_s" {
  description = "Drain timeout passed to the templates."
  type        = number
  default     = 60
}

locals {
  templates = "${path.module}/../../modules/region/templates"
  files     = "${path.module}/../../modules/region/files"
  common = {
    datacenter     = "eu-west"
    auto_join      = "provider=aws tag_key=gpuroute-consul tag_value=gpuroute-consul-eu-west"
    consul_version = "1.22.2"
    aws_region     = "eu-central-1"
    ssm_prefix     = "/gpuroute/eu-west"
  }
  consul_client = templatefile("${local.templates}/consul-client.sh.tftpl", local.common)
}

output "consul_server" {
  description = "A rendered Consul server user-data script."
  value = templatefile("${local.templates}/consul-server.sh.tftpl", merge(local.common, {
    node_name = "consul-eu-west-1"
    servers   = 3
    wan_join  = ["10.64.128.10", "10.64.144.10"]
  }))
}

output "gpu_node" {
  description = "A rendered GPU-node user-data script (vLLM on an 8-GPU host)."
  value = templatefile("${local.templates}/gpu-node.sh.tftpl", merge(local.common, {
    consul_client     = local.consul_client
    region            = "eu-west"
    zone              = "eu-central-1a"
    gpu               = "A100"
    gpu_count         = 8
    capacity          = 3.28
    models            = ["llama-3.1-8b"]
    engine            = { kind = "vllm", image = "vllm/vllm-openai:v0.11.0", model = "meta-llama/Llama-3.1-8B-Instruct" }
    gpuroute          = "https://artifacts.example.internal/gpuroute/gpuroute-0.1.0-py3-none-any.whl"
    requirements_lock = file("${path.module}/../../../../requirements.lock")
    drain_timeout_s   = var.drain_timeout_s
    agent_unit        = file("${path.module}/../../../systemd/gpuroute-agent.service")
    lifecycle_hook    = "gpuroute-drain"
    lifecycle_watcher = file("${local.files}/gpuroute-lifecycle.sh")
  }))
}

locals {
  router_inputs = merge(local.common, {
    consul_client     = local.consul_client
    region            = "eu-west"
    jurisdiction      = "eu"
    gpuroute          = "https://artifacts.example.internal/gpuroute/gpuroute-0.1.0-py3-none-any.whl"
    requirements_lock = file("${path.module}/../../../../requirements.lock")
    drain_timeout_s   = var.drain_timeout_s
    allow_anonymous   = false
    api_keys = [
      { sha256 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", tenant = "acme", residency = null },
      { sha256 = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210", tenant = "acme-eu", residency = ["eu"] },
    ]
    regions_toml    = file("${path.module}/../../../../regions.example.toml")
    trusted_proxies = ["10.65.0.0/16", "10.64.0.0/16"]
    # the regional routers' CloudWatch agent
    metrics_log_group        = "/gpuroute/eu-west/router-metrics"
    metric_namespace         = "gpuroute"
    cloudwatch_agent_version = "latest"
  })
}

output "router" {
  description = "A rendered regional-router user-data script."
  value = templatefile("${local.templates}/router.sh.tftpl", merge(local.router_inputs, {
    port = 8080
    unit = file("${path.module}/../../../systemd/gpuroute-router.service")
  }))
}

output "global" {
  description = "A rendered global-tier user-data script."
  value = templatefile("${local.templates}/global.sh.tftpl", merge(local.router_inputs, {
    port = 8090
    unit = file("${path.module}/../../../systemd/gpuroute-global.service")
  }))
}
