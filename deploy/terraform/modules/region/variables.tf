variable "name" {
  description = "gpuroute region name (also the Consul datacenter name), e.g. us-east."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,31}$", var.name))
    error_message = "name must be lowercase letters, digits and dashes, starting with a letter."
  }
}

variable "vpc_cidr" {
  description = "The region's VPC CIDR (fleet-plan output vpc_cidrs)."
  type        = string
}

variable "azs" {
  description = "Availability zones, in the order fleet-plan used for the subnets; at least 3."
  type        = list(string)

  validation {
    condition     = length(var.azs) >= 3 && length(distinct(var.azs)) == length(var.azs)
    error_message = "At least 3 distinct availability zones: one Consul server in each."
  }
}

variable "public_subnets" {
  description = "Public subnet CIDRs, one per AZ (fleet-plan output subnets[region].public)."
  type        = list(string)
}

variable "private_subnets" {
  description = "Private subnet CIDRs, one per AZ (fleet-plan output subnets[region].private)."
  type        = list(string)
}

variable "consul_servers" {
  description = "The region's Consul servers (fleet-plan output consul_servers[region]): name, az, subnet, private_ip."
  type = list(object({
    name       = string
    az         = string
    subnet     = string
    private_ip = string
  }))

  validation {
    condition     = length(var.consul_servers) >= 3 && length(distinct([for s in var.consul_servers : s.az])) >= 3
    error_message = "At least 3 Consul servers in 3 distinct availability zones."
  }
}

variable "consul_version" {
  description = "Consul release installed on every node (servers and client agents)."
  type        = string
  default     = "1.22.2"
}

variable "consul_gossip_key" {
  description = "Consul gossip encryption key (32 bytes, base64; `consul keygen`). The same in every region for WAN gossip."
  type        = string
  sensitive   = true

  validation {
    condition     = can(base64decode(var.consul_gossip_key)) && length(base64decode(var.consul_gossip_key)) == 32
    error_message = "consul_gossip_key must be 32 bytes, base64-encoded (`consul keygen`)."
  }
}

variable "consul_acl_bootstrap_token" {
  description = "Consul ACL initial management token (a UUID). Keep it in a secret store; agents get narrower tokens."
  type        = string
  sensitive   = true
}

variable "consul_agent_token" {
  description = "Consul ACL token of the Consul client agents on every host (their node's registration and anti-entropy): node:write, service:read; no service:write. Stored in SSM, never in user data."
  type        = string
  sensitive   = true
}

variable "consul_engine_token" {
  description = "Consul ACL token the gpuroute agents on GPU hosts register their engine with: service:write on gpuroute-engine, nothing else. Only GPU hosts may read it. Stored in SSM, never in user data."
  type        = string
  sensitive   = true
}

variable "consul_ca_pem" {
  description = "Consul's CA certificate (PEM; `consul tls ca create`). Servers verify each other and clients verify servers with it; clients get their certificates by auto-encrypt."
  type        = string
  sensitive   = true
}

variable "consul_server_cert_pem" {
  description = "This region's Consul server certificate (PEM; `consul tls cert create -server -dc <region>`), signed by consul_ca_pem. Stored in SSM."
  type        = string
  sensitive   = true
}

variable "consul_server_key_pem" {
  description = "The key of consul_server_cert_pem (PEM). Stored in SSM, readable by the Consul servers only."
  type        = string
  sensitive   = true
}

variable "residency_decision_key" {
  description = "The key the global tier signs residency decisions with and regional routers check (random, e.g. `openssl rand -hex 32`); the same in every region. Stored in SSM."
  type        = string
  sensitive   = true

  validation {
    condition     = length(var.residency_decision_key) >= 32
    error_message = "residency_decision_key must be at least 32 characters."
  }
}

variable "admin_token" {
  description = "Bearer token for the routers' and the global tier's /metrics and /admin/* on their admin port (9090, which the load balancer's /readyz also uses); random, e.g. `openssl rand -hex 32`. Stored in SSM."
  type        = string
  sensitive   = true

  validation {
    condition     = length(var.admin_token) >= 32
    error_message = "admin_token must be at least 32 characters."
  }
}

variable "load_stream_token" {
  description = "The token GPU hosts' agents and the regional routers share on the agents' gRPC load streams (random, e.g. `openssl rand -hex 32`): agents answer only routers that prove they hold it, and routers take a report only with its agent's proof. Stored in SSM."
  type        = string
  sensitive   = true

  validation {
    condition     = length(var.load_stream_token) >= 32
    error_message = "load_stream_token must be at least 32 characters."
  }
}

variable "consul_router_token" {
  description = "Consul ACL token for regional routers: service:read on gpuroute-engine, service:write on gpuroute-router, node:read. Stored in SSM, never in user data."
  type        = string
  sensitive   = true
}

variable "consul_global_token" {
  description = "Consul ACL token for the global tier: service:read on gpuroute-router in every datacenter. Stored in SSM, never in user data."
  type        = string
  sensitive   = true
}

variable "wan_join" {
  description = "Consul server IPs of the other federating regions (fleet-plan output federation[region]); empty = not federated."
  type        = list(string)
  default     = []
}

variable "wan_peer_cidrs" {
  description = "VPC CIDRs of the federating regions whose Consul servers may reach this region's servers (WAN gossip and RPC)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.wan_peer_cidrs : !contains(["0.0.0.0/0", "::/0"], c)])
    error_message = "wan_peer_cidrs are peer VPCs, never 0.0.0.0/0 or ::/0."
  }
}

variable "gpu_node_groups" {
  description = "This region's GPU node groups (fleet-plan output gpu_node_groups filtered to the region). Each host runs engines_per_host engines of the group's engine (kind, image, arguments without host and port; the Hugging Face token's Secrets Manager or SSM name), each on its own GPUs and port (engines), with one gpuroute agent each. hosts is each group's size at creation; min_hosts and max_hosts (default hosts) bound it, and above min a policy follows the routers' desired backends for the group's model (an autoscaling group serves one model, which no other group of the region serves); standby_hosts wait warm (modules/gpu-autoscaling checks them)."
  type = map(object({
    region            = string
    name              = string
    gpu               = string
    gpus              = number
    instance_type     = string
    gpus_per_host     = number
    tensor_parallel   = number
    pipeline_parallel = number
    engines_per_host  = number
    hosts             = number
    capacity          = optional(number)
    models            = list(string)
    engine = object({
      kind  = string
      image = string
      args  = list(string)
      hf_token = optional(object({
        source = string
        name   = string
      }))
    })
    engines = list(object({
      index            = number
      port             = number
      gpu_indices      = list(number)
      load_stream_port = number
      admin_port       = number
    }))
    az            = string
    min_hosts     = optional(number)
    max_hosts     = optional(number)
    standby_hosts = optional(number, 0)
  }))
  default = {}

  # (the engine's kind and token source are fleet-plan's to check: it is what gives them)
  validation {
    condition     = alltrue([for g in values(var.gpu_node_groups) : length(g.engines) >= 1])
    error_message = "Every GPU node group runs at least one engine per host: ${join(", ", [for k, g in var.gpu_node_groups : k if length(g.engines) < 1])}."
  }
}

variable "gpu_types" {
  description = "GPU types the fleet file declares ([[gpu_types]], without aws_instance_types; gpuroute tfvars writes them): written into every agent's and regional router's config, which know only the built-in types otherwise."
  type = list(object({
    name                 = string
    memory_gb            = number
    memory_bandwidth_tbs = number
    fp16_tflops          = number
    fp8_tflops           = optional(number)
    interconnect_gbs     = optional(number)
    price_per_hour       = optional(number)
    tdp_w                = optional(number)
    device_names         = optional(list(string))
  }))
  default = []
}

variable "models" {
  description = "The fleet file's [[models]] as the regional routers read them (gpuroute tfvars writes them): name, aliases, split (version => percentage), fallback, slo_class and the shape (shape, explicit fields, or config_json_text: a config.json's text, written next to the router's config and named by its config_json). Written into every regional router's config."
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
  default = []

  validation {
    condition     = alltrue([for m in var.models : m.config_json_text == null || can(jsondecode(m.config_json_text))])
    error_message = "models[*].config_json_text is a config.json's JSON text (gpuroute tfvars writes it): ${join(", ", [for m in var.models : m.name if !(m.config_json_text == null || can(jsondecode(m.config_json_text)))])}."
  }
}

variable "cloudwatch_agent_version" {
  description = "CloudWatch agent release on the regional routers (it publishes the routers' desired backends per pool for the GPU groups' scaling policies); `latest`, or a version to pin. Its package is verified against AWS's signing key either way."
  type        = string
  default     = "latest"

  validation {
    condition     = can(regex("^(latest|[0-9][0-9a-z.]*)$", var.cloudwatch_agent_version))
    error_message = "cloudwatch_agent_version is `latest` or a release version (digits, dots, lowercase letters)."
  }
}

variable "gpuroute_package" {
  description = "https URL of the gpuroute wheel in your artifact store (built from this repository with `pip wheel --no-deps .`), never a name resolved on the public index. Its dependencies come from requirements.lock, by hash."
  type        = string

  validation {
    condition     = startswith(var.gpuroute_package, "https://") && endswith(var.gpuroute_package, ".whl")
    error_message = "gpuroute_package must be an https:// URL of a .whl in your artifact store."
  }
}

variable "gpuroute_requirements_url" {
  description = "https URL of this repository's requirements.lock in your artifact store; null: requirements.lock next to the wheel (gpuroute_package's folder). Hosts download it, check it against the sha256 of the repository's own requirements.lock (rendered into user data, which is too small for the file itself: EC2 takes 16 KB) and install from it by hash."
  type        = string
  default     = null

  validation {
    condition     = var.gpuroute_requirements_url == null || can(regex("^https://[^'\\s]+$", var.gpuroute_requirements_url))
    error_message = "gpuroute_requirements_url must be an https:// URL (no quotes or spaces) of requirements.lock in your artifact store."
  }
}

variable "ami_id" {
  description = "AMI for Consul servers and routers (Debian 12 or Ubuntu 24.04 with systemd and python3)."
  type        = string
}

variable "gpu_ami_id" {
  description = "AMI for GPU nodes, with the NVIDIA driver and container toolkit (e.g. an AWS Deep Learning Base AMI)."
  type        = string
}

variable "consul_instance_type" {
  description = "Instance type of the Consul servers."
  type        = string
  default     = "t3.medium"
}

variable "router_instance_type" {
  description = "Instance type of the regional routers."
  type        = string
  default     = "c7i.xlarge"
}

variable "routers" {
  description = "Regional router count (min, desired, max) behind the network load balancer."
  type = object({
    min     = number
    desired = number
    max     = number
  })
  default = { min = 2, desired = 2, max = 6 }

  validation {
    condition     = var.routers.min >= 2 && var.routers.min <= var.routers.desired && var.routers.desired <= var.routers.max
    error_message = "At least 2 routers (one can drain while the other serves), and min <= desired <= max."
  }
}

variable "global_routers" {
  description = "Global-tier routers in this region (0 = none); the global module points DNS at their load balancer."
  type        = number
  default     = 0
}

variable "client_cidrs" {
  description = "Who may call the inference API on the load balancer (port 443, or 80 with allow_plaintext_api). The API only: Consul, agent and admin ports are never opened to these. No default: say who your clients are."
  type        = list(string)
}

variable "jurisdiction" {
  description = "The region's jurisdiction from the regions file (e.g. eu): API keys' residency sets may name it."
  type        = string
}

variable "api_keys" {
  description = "API keys the routers (and the global tier) accept: sha256 of each key (never the key), its tenant and, optionally, the regions or jurisdictions it may be served in."
  type = list(object({
    sha256    = string
    tenant    = string
    residency = optional(list(string))
  }))
  default = []

  validation {
    condition     = alltrue([for k in var.api_keys : can(regex("^[0-9a-f]{64}$", k.sha256))])
    error_message = "api_keys[*].sha256 must be a lowercase sha256 hex digest of the key."
  }
}

variable "allow_anonymous_api" {
  description = "Serve requests without an API key (they share the anonymous tenant's quota). Off by default: with it off, api_keys must list at least one key."
  type        = bool
  default     = false
}

variable "allow_plaintext_api" {
  description = "Serve the inference API over plain TCP on port 80 when no tls_certificate_arn is set (private tests only). Off by default: without a certificate the plan fails."
  type        = bool
  default     = false
}

variable "regions_toml" {
  description = "The fleet's regions file (regions.example.toml) as text; the global tier's routers need it (global_routers > 0)."
  type        = string
  default     = ""
}

variable "admin_cidrs" {
  description = "Operator networks (VPN, bastion) allowed to reach admin and metrics ports. Never the whole internet."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.admin_cidrs : !contains(["0.0.0.0/0", "::/0"], c)])
    error_message = "admin_cidrs must not contain 0.0.0.0/0 or ::/0."
  }
}

variable "tls_certificate_arn" {
  description = "ACM certificate for the load balancer's TLS listener (443); null = plain TCP on port 80 (tests, private use)."
  type        = string
  default     = null
}

variable "drain_timeout_s" {
  description = "Router and agent drain timeout; instance refresh and systemd stop wait a little longer."
  type        = number
  default     = 60
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
