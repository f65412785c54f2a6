# `terraform test` on the pure module: no provider, no cloud account.

variables {
  regions = {
    us-east = {
      aws_region   = "us-east-1"
      cidr_index   = 0
      jurisdiction = "us"
      azs          = ["us-east-1a", "us-east-1b", "us-east-1c"]
      neighbours   = ["eu-west", "ap-northeast"]
      gpu_pools = [
        { gpu = "H100", count = 4, models = ["llama-3.1-70b"] },
        { gpu = "L4", count = 3, models = ["llama-3.1-8b"], zone = "us-east-1c", min_hosts = 2, max_hosts = 8, standby_hosts = 1 },
      ]
    }
    eu-west = {
      aws_region   = "eu-central-1"
      cidr_index   = 1
      jurisdiction = "eu"
      azs          = ["eu-central-1a", "eu-central-1b", "eu-central-1c"]
      neighbours   = ["us-east", "ap-northeast"]
      gpu_pools    = [{ gpu = "A100", count = 9, models = ["llama-3.1-8b"] }]
    }
    ap-northeast = {
      aws_region   = "ap-northeast-1"
      cidr_index   = 2
      jurisdiction = "jp"
      azs          = ["ap-northeast-1a", "ap-northeast-1c", "ap-northeast-1d"]
      federate     = false
      neighbours   = ["us-east", "eu-west"]
      gpu_pools    = []
    }
  }
}

run "addresses_do_not_overlap" {
  command = plan

  assert {
    condition     = output.vpc_cidrs == { us-east = "10.64.0.0/16", eu-west = "10.65.0.0/16", ap-northeast = "10.66.0.0/16" }
    error_message = "each region gets the /16 at its cidr_index"
  }

  assert {
    condition     = output.subnets["eu-west"].private == ["10.65.128.0/20", "10.65.144.0/20", "10.65.160.0/20"]
    error_message = "private subnets are the upper half of the VPC, one /20 per AZ"
  }

  assert {
    condition     = output.subnets["us-east"].public[0] == "10.64.0.0/20"
    error_message = "public subnets start at the bottom of the VPC"
  }
}

run "three_consul_servers_in_distinct_azs" {
  command = plan

  assert {
    condition     = alltrue([for name, servers in output.consul_servers : length(servers) == 3 && length(distinct([for s in servers : s.az])) == 3])
    error_message = "every region has 3 Consul servers, each in its own AZ"
  }

  assert {
    condition     = [for s in output.consul_servers["us-east"] : s.private_ip] == ["10.64.128.10", "10.64.144.10", "10.64.160.10"]
    error_message = "server IPs are fixed (retry_join and WAN federation use them)"
  }
}

run "failover_and_federation" {
  command = plan

  assert {
    condition     = output.failover_order["eu-west"] == ["us-east", "ap-northeast"]
    error_message = "failover follows the neighbour order"
  }

  assert {
    condition     = !contains(keys(output.federation), "ap-northeast") && output.federation["us-east"] == ["10.65.128.10", "10.65.144.10", "10.65.160.10"]
    error_message = "a region with federate = false neither joins nor is joined"
  }

  assert {
    condition     = output.federation_pairs == ["eu-west:us-east"]
    error_message = "one peering per pair of federating regions"
  }
}

run "gpu_pools_become_node_groups" {
  command = plan

  assert {
    condition     = output.gpu_node_groups["us-east/h100-0"].instance_type == "p5.48xlarge" && output.gpu_node_groups["us-east/h100-0"].hosts == 1
    error_message = "4 H100s fit on one p5.48xlarge"
  }

  assert {
    condition     = output.gpu_node_groups["eu-west/a100-0"].hosts == 2 && output.gpu_node_groups["eu-west/a100-0"].capacity == 0.41 * 8
    error_message = "9 A100s need two 8-GPU hosts, each weighing 8 A100s"
  }

  assert {
    condition     = output.gpu_node_groups["us-east/l4-1"].az == "us-east-1c" && output.gpu_node_groups["us-east/l4-1"].hosts == 3
    error_message = "an explicit zone wins; L4 hosts carry one GPU"
  }

  assert {
    condition     = output.gpu_node_groups["us-east/l4-1"].min_hosts == 2 && output.gpu_node_groups["us-east/l4-1"].max_hosts == 8 && output.gpu_node_groups["us-east/l4-1"].standby_hosts == 1
    error_message = "autoscaling bounds and standby hosts pass through to the node group"
  }

  assert {
    condition     = output.gpu_node_groups["us-east/l4-1"].models == tolist(["llama-3.1-8b"]) && output.gpu_node_groups["us-east/h100-0"].models == tolist(["llama-3.1-70b"])
    error_message = "the models pass through: modules/gpu-autoscaling names an autoscaling group's pool after its one model"
  }

  assert {
    condition     = output.gpu_node_groups["eu-west/a100-0"].min_hosts == null && output.gpu_node_groups["eu-west/a100-0"].max_hosts == null && output.gpu_node_groups["eu-west/a100-0"].standby_hosts == 0
    error_message = "a pool without bounds stays a fixed group (modules/gpu-autoscaling: min = max = hosts)"
  }
}

run "two_azs_are_rejected" {
  command = plan

  variables {
    regions = {
      small = {
        aws_region   = "us-west-1"
        cidr_index   = 5
        jurisdiction = "us"
        azs          = ["us-west-1a", "us-west-1b"]
        neighbours   = []
        gpu_pools    = []
      }
    }
  }

  expect_failures = [var.regions]
}

run "duplicate_cidr_index_is_rejected" {
  command = plan

  variables {
    regions = {
      a = { aws_region = "us-east-1", cidr_index = 1, jurisdiction = "us", azs = ["a", "b", "c"], neighbours = [], gpu_pools = [] }
      b = { aws_region = "us-east-2", cidr_index = 1, jurisdiction = "us", azs = ["d", "e", "f"], neighbours = [], gpu_pools = [] }
    }
  }

  expect_failures = [var.regions]
}
