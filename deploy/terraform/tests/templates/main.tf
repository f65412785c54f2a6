# Renders the region module's user-data templates without any provider, so `terraform test`
# can check them offline (the AWS modules themselves need provider plugins to plan).

variable "drain_timeout_s" {
  description = "Drain timeout passed to the templates."
  type        = number
  default     = 60
}

variable "models" {
  description = "The routers' [[models]] as gpuroute tfvars writes them (modules/region's variable); the default holds every kind of entry but a config.json, which tests pass in."
  type = list(object({
    name             = string
    aliases          = optional(list(string))
    split            = optional(map(number))
    fallback         = optional(list(string))
    slo_class        = optional(string)
    shape            = optional(string)
    config_json_text = optional(string)
    params_b         = optional(number)
    active_params_b  = optional(number)
    layers           = optional(number)
    hidden           = optional(number)
    kv_heads         = optional(number)
    head_dim         = optional(number)
    kv_latent_dim    = optional(number)
    kv_layers        = optional(number)
    max_model_len    = optional(number)
    weight_dtype     = optional(string)
    kv_cache_dtype   = optional(string)
  }))
  default = [
    { name = "llama-3.1-70b", fallback = ["llama-3.1-8b"], slo_class = "interactive" },
    { name = "llama-3.1-8b", aliases = ["llama-8b", "small"], split = { "llama-3.1-8b@v1" = 90, "llama-3.1-8b@v2" = 10 } },
    { name = "qwen3-30b-a3b", shape = "qwen3-30b-a3b", weight_dtype = "fp8", kv_cache_dtype = "fp8" },
    { name = "house-13b", params_b = 13, layers = 40, hidden = 5120, kv_heads = 40, head_dim = 128, max_model_len = 4096, weight_dtype = "bf16" },
  ]
}

locals {
  # a GPU type the fleet file declares (gpuroute tfvars passes it on without its instances)
  rtx_pro_6000 = {
    name             = "RTX-PRO-6000", memory_gb = 96, memory_bandwidth_tbs = 1.79, fp16_tflops = 500, fp8_tflops = 1000
    interconnect_gbs = null, price_per_hour = 3.4, tdp_w = null
    device_names     = ["NVIDIA RTX PRO 6000 Blackwell Server Edition"]
  }
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
  # the region module's shared snippets (routers.tf), as it renders them
  install_gpuroute = templatefile("${local.templates}/install-gpuroute.sh.tftpl", {
    requirements_url    = "https://artifacts.example.internal/gpuroute/requirements.lock"
    requirements_sha256 = filesha256("${path.module}/../../../../requirements.lock")
    gpuroute            = "https://artifacts.example.internal/gpuroute/gpuroute-0.1.0-py3-none-any.whl"
  })
}

output "consul_server" {
  description = "A rendered Consul server user-data script."
  value = templatefile("${local.templates}/consul-server.sh.tftpl", merge(local.common, {
    node_name = "consul-eu-west-1"
    servers   = 3
    wan_join  = ["10.64.128.10", "10.64.144.10"]
  }))
}

locals {
  gpu_node_inputs = merge(local.common, {
    consul_client     = local.consul_client
    region            = "eu-west"
    pool              = "llama70b-h200"
    zone              = "eu-central-1a"
    gpu               = "H200"
    models            = ["llama-3.1-70b", "llama-70b"]
    tensor_parallel   = 4
    pipeline_parallel = 1
    capacity          = null
    gpu_types_toml    = templatefile("${local.templates}/gpu-types.toml.tftpl", { gpu_types = [] })
    install_gpuroute  = local.install_gpuroute
    drain_timeout_s   = var.drain_timeout_s
    agent_unit        = file("${path.module}/../../../systemd/gpuroute-agent.service")
    lifecycle_hook    = "gpuroute-drain"
    lifecycle_watcher = file("${local.files}/gpuroute-lifecycle.sh")
    # fleet-plan's packing of a p5e.48xlarge with two TP4 engines
    engines = [
      { index = 0, port = 8000, gpu_indices = [0, 1, 2, 3], load_stream_port = 7070, admin_port = 7071 },
      { index = 1, port = 8001, gpu_indices = [4, 5, 6, 7], load_stream_port = 7072, admin_port = 7073 },
    ]
  })
}

output "gpu_node" {
  description = "A rendered GPU-node user-data script: two vLLM TP4 engines of a 70B on a p5e.48xlarge, the token from Secrets Manager."
  value = templatefile("${local.templates}/gpu-node.sh.tftpl", merge(local.gpu_node_inputs, {
    engine = {
      kind  = "vllm"
      image = "vllm/vllm-openai:v0.32.0"
      args = [
        "--model", "meta-llama/Llama-3.1-70B-Instruct", "--served-model-name", "llama-3.1-70b", "llama-70b",
        "--tensor-parallel-size", "4", "--pipeline-parallel-size", "1", "--quantization", "fp8",
        "--override-generation-config", "{\"temperature\": 0.5}",
      ]
      hf_token = { source = "secretsmanager", name = "gpuroute/hf-token" }
    }
  }))
}

output "gpu_node_sglang" {
  description = "A rendered GPU-node user-data script: one SGLang engine on a one-GPU host of a declared GPU type, the token from SSM, a capacity weight."
  value = templatefile("${local.templates}/gpu-node.sh.tftpl", merge(local.gpu_node_inputs, {
    pool            = "qwen-moe-rtx"
    gpu             = "RTX-PRO-6000"
    gpu_types_toml  = templatefile("${local.templates}/gpu-types.toml.tftpl", { gpu_types = [local.rtx_pro_6000] })
    models          = ["qwen3-30b-a3b"]
    tensor_parallel = 1
    capacity        = 0.4
    engines         = [{ index = 0, port = 8000, gpu_indices = [0], load_stream_port = 7070, admin_port = 7071 }]
    engine = {
      kind     = "sglang"
      image    = "lmsysorg/sglang:v0.5.6"
      args     = ["--model-path", "Qwen/Qwen3-30B-A3B", "--served-model-name", "qwen3-30b-a3b", "--tp-size", "1", "--pp-size", "1", "--enable-metrics"]
      hf_token = { source = "ssm", name = "/gpuroute/hf-token" }
    }
  }))
}

output "gpu_node_eight_engines" {
  description = "The largest GPU-node user data: eight one-GPU vLLM engines (and agents) on an 8-GPU host, declared GPU types, the token from Secrets Manager."
  value = templatefile("${local.templates}/gpu-node.sh.tftpl", merge(local.gpu_node_inputs, {
    tensor_parallel = 1
    gpu_types_toml  = templatefile("${local.templates}/gpu-types.toml.tftpl", { gpu_types = [local.rtx_pro_6000, merge(local.rtx_pro_6000, { name = "RTX-PRO-6000-MAXQ", tdp_w = 300, device_names = ["NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"] })] })
    engines = [for i in range(8) : {
      index = i, port = 8000 + i, gpu_indices = [i], load_stream_port = 7070 + 2 * i, admin_port = 7071 + 2 * i
    }]
    engine = {
      kind  = "vllm"
      image = "vllm/vllm-openai:v0.32.0"
      args = [
        "--model", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama-3.1-8b", "llama-8b",
        "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1", "--max-model-len", "32768",
        "--enable-lora", "--lora-modules", "sql-lora=org/sql-lora", "--enable-prefix-caching",
      ]
      hf_token = { source = "secretsmanager", name = "gpuroute/hf-token" }
    }
  }))
}

output "gpu_node_public_model" {
  description = "A rendered GPU-node user-data script for a model that needs no token."
  value = templatefile("${local.templates}/gpu-node.sh.tftpl", merge(local.gpu_node_inputs, {
    engines = [{ index = 0, port = 8000, gpu_indices = [0], load_stream_port = 7070, admin_port = 7071 }]
    engine  = { kind = "vllm", image = "vllm/vllm-openai:v0.32.0", args = ["--model", "Qwen/Qwen3-8B"], hf_token = null }
  }))
}

locals {
  router_inputs = merge(local.common, {
    consul_client    = local.consul_client
    region           = "eu-west"
    jurisdiction     = "eu"
    install_gpuroute = local.install_gpuroute
    drain_timeout_s  = var.drain_timeout_s
    allow_anonymous  = false
    api_keys = [
      { sha256 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", tenant = "acme", residency = null },
      { sha256 = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210", tenant = "acme-eu", residency = ["eu"] },
    ]
    regions_toml    = file("${path.module}/../../../../fleet.example.toml")
    gpu_types_toml  = templatefile("${local.templates}/gpu-types.toml.tftpl", { gpu_types = [local.rtx_pro_6000] })
    models          = var.models
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
