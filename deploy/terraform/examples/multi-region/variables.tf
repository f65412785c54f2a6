# Written by `gpuroute tfvars fleet.example.toml > terraform.tfvars.json` ----------------------

variable "regions" {
  description = "The fleet's regions, from the fleet file (gpuroute tfvars): AWS region, CIDR index, jurisdiction, AZs, neighbours nearest first, GPU pools with their instance type, parallelism and engine (modules/fleet-plan documents each key)."
  type = map(object({
    aws_region   = string
    cidr_index   = number
    jurisdiction = string
    azs          = list(string)
    federate     = optional(bool, true)
    neighbours   = list(string)
    gpu_pools = list(object({
      name              = optional(string)
      gpu               = string
      count             = number
      models            = list(string)
      zone              = optional(string)
      min_hosts         = optional(number)
      max_hosts         = optional(number)
      standby_hosts     = optional(number, 0)
      capacity_weight   = optional(number)
      instance_type     = optional(string)
      gpus_per_host     = optional(number)
      tensor_parallel   = optional(number, 1)
      pipeline_parallel = optional(number, 1)
      engine = object({
        kind  = string
        image = string
        args  = optional(list(string), [])
        hf_token = optional(object({
          source = string
          name   = string
        }))
      })
    }))
  }))
}

variable "gpu_types" {
  description = "GPU types the fleet file declares (gpuroute tfvars): the agents and routers learn them from their configs."
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
  description = "The fleet file's [[models]] as the regional routers read them (gpuroute tfvars; modules/region documents each key)."
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
}

variable "global_regions" {
  description = "Regions that run the global tier (at least two), from the fleet file (gpuroute tfvars)."
  type        = list(string)
}

# Yours to set (terraform.tfvars, or TF_VAR_* for the secrets) -----------------------------------

variable "amis" {
  description = "Per gpuroute region: AMI for Consul servers and routers, and the GPU AMI (NVIDIA driver + container toolkit)."
  type = map(object({
    ami_id     = string
    gpu_ami_id = string
  }))
}

variable "consul_gossip_key" {
  description = "Consul gossip encryption key (`consul keygen`), shared by all regions."
  type        = string
  sensitive   = true
}

variable "consul_acl_bootstrap_token" {
  description = "Consul ACL initial management token (a UUID)."
  type        = string
  sensitive   = true
}

variable "consul_agent_token" {
  description = "Consul ACL token of the Consul client agents (node:write, service:read)."
  type        = string
  sensitive   = true
}

variable "consul_engine_token" {
  description = "Consul ACL token the GPU hosts' gpuroute agents register with (service:write on gpuroute-engine only)."
  type        = string
  sensitive   = true
}

variable "domain_name" {
  description = "The global endpoint, e.g. api.inference.example.com."
  type        = string
}

variable "hosted_zone_id" {
  description = "Route 53 hosted zone of domain_name."
  type        = string
}

variable "tls_certificate_arns" {
  description = "Per gpuroute region: ACM certificate for the load balancers' TLS listeners. Every region needs one: the region module refuses plaintext unless allow_plaintext_api is set."
  type        = map(string)
  default     = {}
}

variable "admin_cidrs" {
  description = "Operator networks allowed to reach admin and metrics ports (never 0.0.0.0/0)."
  type        = list(string)
  default     = []
}

variable "client_cidrs" {
  description = "Who may call the inference API on the global tier's load balancers (443). No default: name your clients' networks (0.0.0.0/0 is allowed only for a TLS listener with keys, which this example always has)."
  type        = list(string)
}

variable "api_keys" {
  description = "API keys every router and the global tier accept: sha256 of each key (never the key), tenant, optional residency."
  type = list(object({
    sha256    = string
    tenant    = string
    residency = optional(list(string))
  }))
  sensitive = true
}

variable "regions_file" {
  description = "Path to the fleet file gpuroute tfvars read (the global tier's routers get a copy as their regions_file)."
  type        = string
  default     = "../../../../fleet.example.toml"
}

variable "gpuroute_wheel_url" {
  description = "https URL of the gpuroute wheel in your artifact store (`pip wheel --no-deps .` from this repository)."
  type        = string
}

variable "gpuroute_requirements_url" {
  description = "https URL of this repository's requirements.lock in your artifact store; null (default): requirements.lock in the wheel's folder. Hosts check it against the repository's own sha256 before installing from it."
  type        = string
  default     = null
}

variable "consul_router_token" {
  description = "Consul ACL token for regional routers (docs/deploy.md, step 5, lists its policy); stored in SSM."
  type        = string
  sensitive   = true
}

variable "consul_global_token" {
  description = "Consul ACL token for the global tier (docs/deploy.md, step 5); stored in SSM."
  type        = string
  sensitive   = true
}

variable "consul_ca_pem" {
  description = "Consul's CA certificate (`consul tls ca create`), the same in every region."
  type        = string
  sensitive   = true
}

variable "consul_server_certs" {
  description = "Per gpuroute region: its Consul servers' certificate and key (`consul tls cert create -server -dc <region>`)."
  type = map(object({
    cert = string
    key  = string
  }))
  sensitive = true
}

variable "residency_decision_key" {
  description = "The key the global tier signs residency decisions with (`openssl rand -hex 32`); stored in SSM."
  type        = string
  sensitive   = true
}

variable "admin_token" {
  description = "Bearer token for /metrics and /admin/* on the routers' and global tier's admin port (`openssl rand -hex 32`); stored in SSM."
  type        = string
  sensitive   = true
}

variable "load_stream_token" {
  description = "The token agents and routers share on the agents' load streams (`openssl rand -hex 32`); stored in SSM."
  type        = string
  sensitive   = true
}
