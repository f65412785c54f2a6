# Three regions from fleet.example.toml, federated, with the global tier in two of them
# behind one latency-routed DNS name. Terraform cannot loop over providers, so each region
# has its own provider alias and module block; adding a region means adding both (and its
# peerings): docs/deploy.md, "Add a region".

module "plan" {
  source  = "../../modules/fleet-plan"
  regions = var.regions
}

locals {
  region_inputs = {
    for name, r in var.regions : name => {
      vpc_cidr            = module.plan.vpc_cidrs[name]
      azs                 = r.azs
      public_subnets      = module.plan.subnets[name].public
      private_subnets     = module.plan.subnets[name].private
      consul_servers      = module.plan.consul_servers[name]
      wan_join            = lookup(module.plan.federation, name, [])
      wan_peer_cidrs      = contains(keys(module.plan.federation), name) ? [for other in keys(module.plan.federation) : module.plan.vpc_cidrs[other] if other != name] : []
      gpu_node_groups     = { for k, g in module.plan.gpu_node_groups : k => g if g.region == name }
      global_routers      = contains(var.global_regions, name) ? 2 : 0
      tls_certificate_arn = lookup(var.tls_certificate_arns, name, null)
    }
  }
}

provider "aws" {
  alias  = "us_east"
  region = try(var.regions["us-east"].aws_region, "us-east-1")
}

provider "aws" {
  alias  = "eu_west"
  region = try(var.regions["eu-west"].aws_region, "eu-central-1")
}

provider "aws" {
  alias  = "ap_northeast"
  region = try(var.regions["ap-northeast"].aws_region, "ap-northeast-1")
}

module "us_east" {
  source    = "../../modules/region"
  count     = contains(keys(var.regions), "us-east") ? 1 : 0
  providers = { aws = aws.us_east }

  name                       = "us-east"
  vpc_cidr                   = local.region_inputs["us-east"].vpc_cidr
  azs                        = local.region_inputs["us-east"].azs
  public_subnets             = local.region_inputs["us-east"].public_subnets
  private_subnets            = local.region_inputs["us-east"].private_subnets
  consul_servers             = local.region_inputs["us-east"].consul_servers
  wan_join                   = local.region_inputs["us-east"].wan_join
  wan_peer_cidrs             = local.region_inputs["us-east"].wan_peer_cidrs
  gpu_node_groups            = local.region_inputs["us-east"].gpu_node_groups
  gpu_types                  = var.gpu_types
  models                     = var.models
  global_routers             = local.region_inputs["us-east"].global_routers
  tls_certificate_arn        = local.region_inputs["us-east"].tls_certificate_arn
  jurisdiction               = var.regions["us-east"].jurisdiction
  consul_ca_pem              = var.consul_ca_pem
  consul_server_cert_pem     = var.consul_server_certs["us-east"].cert
  consul_server_key_pem      = var.consul_server_certs["us-east"].key
  ami_id                     = var.amis["us-east"].ami_id
  gpu_ami_id                 = var.amis["us-east"].gpu_ami_id
  admin_cidrs                = var.admin_cidrs
  client_cidrs               = var.client_cidrs
  api_keys                   = var.api_keys
  regions_toml               = file(var.regions_file)
  gpuroute_package           = var.gpuroute_wheel_url
  gpuroute_requirements_url  = var.gpuroute_requirements_url
  consul_gossip_key          = var.consul_gossip_key
  consul_acl_bootstrap_token = var.consul_acl_bootstrap_token
  consul_agent_token         = var.consul_agent_token
  consul_engine_token        = var.consul_engine_token
  consul_router_token        = var.consul_router_token
  residency_decision_key     = var.residency_decision_key
  admin_token                = var.admin_token
  load_stream_token          = var.load_stream_token
  consul_global_token        = var.consul_global_token
}

module "eu_west" {
  source    = "../../modules/region"
  count     = contains(keys(var.regions), "eu-west") ? 1 : 0
  providers = { aws = aws.eu_west }

  name                       = "eu-west"
  vpc_cidr                   = local.region_inputs["eu-west"].vpc_cidr
  azs                        = local.region_inputs["eu-west"].azs
  public_subnets             = local.region_inputs["eu-west"].public_subnets
  private_subnets            = local.region_inputs["eu-west"].private_subnets
  consul_servers             = local.region_inputs["eu-west"].consul_servers
  wan_join                   = local.region_inputs["eu-west"].wan_join
  wan_peer_cidrs             = local.region_inputs["eu-west"].wan_peer_cidrs
  gpu_node_groups            = local.region_inputs["eu-west"].gpu_node_groups
  gpu_types                  = var.gpu_types
  models                     = var.models
  global_routers             = local.region_inputs["eu-west"].global_routers
  tls_certificate_arn        = local.region_inputs["eu-west"].tls_certificate_arn
  jurisdiction               = var.regions["eu-west"].jurisdiction
  consul_ca_pem              = var.consul_ca_pem
  consul_server_cert_pem     = var.consul_server_certs["eu-west"].cert
  consul_server_key_pem      = var.consul_server_certs["eu-west"].key
  ami_id                     = var.amis["eu-west"].ami_id
  gpu_ami_id                 = var.amis["eu-west"].gpu_ami_id
  admin_cidrs                = var.admin_cidrs
  client_cidrs               = var.client_cidrs
  api_keys                   = var.api_keys
  regions_toml               = file(var.regions_file)
  gpuroute_package           = var.gpuroute_wheel_url
  gpuroute_requirements_url  = var.gpuroute_requirements_url
  consul_gossip_key          = var.consul_gossip_key
  consul_acl_bootstrap_token = var.consul_acl_bootstrap_token
  consul_agent_token         = var.consul_agent_token
  consul_engine_token        = var.consul_engine_token
  consul_router_token        = var.consul_router_token
  residency_decision_key     = var.residency_decision_key
  admin_token                = var.admin_token
  load_stream_token          = var.load_stream_token
  consul_global_token        = var.consul_global_token
}

module "ap_northeast" {
  source    = "../../modules/region"
  count     = contains(keys(var.regions), "ap-northeast") ? 1 : 0
  providers = { aws = aws.ap_northeast }

  name                       = "ap-northeast"
  vpc_cidr                   = local.region_inputs["ap-northeast"].vpc_cidr
  azs                        = local.region_inputs["ap-northeast"].azs
  public_subnets             = local.region_inputs["ap-northeast"].public_subnets
  private_subnets            = local.region_inputs["ap-northeast"].private_subnets
  consul_servers             = local.region_inputs["ap-northeast"].consul_servers
  wan_join                   = local.region_inputs["ap-northeast"].wan_join
  wan_peer_cidrs             = local.region_inputs["ap-northeast"].wan_peer_cidrs
  gpu_node_groups            = local.region_inputs["ap-northeast"].gpu_node_groups
  gpu_types                  = var.gpu_types
  models                     = var.models
  global_routers             = local.region_inputs["ap-northeast"].global_routers
  tls_certificate_arn        = local.region_inputs["ap-northeast"].tls_certificate_arn
  jurisdiction               = var.regions["ap-northeast"].jurisdiction
  consul_ca_pem              = var.consul_ca_pem
  consul_server_cert_pem     = var.consul_server_certs["ap-northeast"].cert
  consul_server_key_pem      = var.consul_server_certs["ap-northeast"].key
  ami_id                     = var.amis["ap-northeast"].ami_id
  gpu_ami_id                 = var.amis["ap-northeast"].gpu_ami_id
  admin_cidrs                = var.admin_cidrs
  client_cidrs               = var.client_cidrs
  api_keys                   = var.api_keys
  regions_toml               = file(var.regions_file)
  gpuroute_package           = var.gpuroute_wheel_url
  gpuroute_requirements_url  = var.gpuroute_requirements_url
  consul_gossip_key          = var.consul_gossip_key
  consul_acl_bootstrap_token = var.consul_acl_bootstrap_token
  consul_agent_token         = var.consul_agent_token
  consul_engine_token        = var.consul_engine_token
  consul_router_token        = var.consul_router_token
  residency_decision_key     = var.residency_decision_key
  admin_token                = var.admin_token
  load_stream_token          = var.load_stream_token
  consul_global_token        = var.consul_global_token
}

locals {
  regions_built = merge(
    { for m in module.us_east : "us-east" => m },
    { for m in module.eu_west : "eu-west" => m },
    { for m in module.ap_northeast : "ap-northeast" => m },
  )
}

# WAN federation needs private connectivity between the servers: one peering per pair.
module "peer_ap_northeast_eu_west" {
  source    = "../../modules/peering"
  count     = contains(module.plan.federation_pairs, "ap-northeast:eu-west") ? 1 : 0
  providers = { aws.requester = aws.ap_northeast, aws.accepter = aws.eu_west }
  requester = { name = "ap-northeast", vpc_id = local.regions_built["ap-northeast"].vpc_id, cidr = module.plan.vpc_cidrs["ap-northeast"], route_table_id = local.regions_built["ap-northeast"].private_route_table_id }
  accepter  = { name = "eu-west", aws_region = var.regions["eu-west"].aws_region, vpc_id = local.regions_built["eu-west"].vpc_id, cidr = module.plan.vpc_cidrs["eu-west"], route_table_id = local.regions_built["eu-west"].private_route_table_id }
}

module "peer_ap_northeast_us_east" {
  source    = "../../modules/peering"
  count     = contains(module.plan.federation_pairs, "ap-northeast:us-east") ? 1 : 0
  providers = { aws.requester = aws.ap_northeast, aws.accepter = aws.us_east }
  requester = { name = "ap-northeast", vpc_id = local.regions_built["ap-northeast"].vpc_id, cidr = module.plan.vpc_cidrs["ap-northeast"], route_table_id = local.regions_built["ap-northeast"].private_route_table_id }
  accepter  = { name = "us-east", aws_region = var.regions["us-east"].aws_region, vpc_id = local.regions_built["us-east"].vpc_id, cidr = module.plan.vpc_cidrs["us-east"], route_table_id = local.regions_built["us-east"].private_route_table_id }
}

module "peer_eu_west_us_east" {
  source    = "../../modules/peering"
  count     = contains(module.plan.federation_pairs, "eu-west:us-east") ? 1 : 0
  providers = { aws.requester = aws.eu_west, aws.accepter = aws.us_east }
  requester = { name = "eu-west", vpc_id = local.regions_built["eu-west"].vpc_id, cidr = module.plan.vpc_cidrs["eu-west"], route_table_id = local.regions_built["eu-west"].private_route_table_id }
  accepter  = { name = "us-east", aws_region = var.regions["us-east"].aws_region, vpc_id = local.regions_built["us-east"].vpc_id, cidr = module.plan.vpc_cidrs["us-east"], route_table_id = local.regions_built["us-east"].private_route_table_id }
}

module "global" {
  source         = "../../modules/global"
  providers      = { aws = aws.us_east } # Route 53 is global; any region's provider works
  domain_name    = var.domain_name
  hosted_zone_id = var.hosted_zone_id
  endpoints = {
    for name in var.global_regions : name => merge(local.regions_built[name].global_endpoint, {
      aws_region = var.regions[name].aws_region
    })
  }
}
