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
        { gpu = "H100", count = 4, models = ["llama-3.1-70b"], capacity_weight = 2.5 },
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
    condition     = output.gpu_node_groups["us-east/h100-0"].instance_type == "p5.4xlarge" && output.gpu_node_groups["us-east/h100-0"].hosts == 4
    error_message = "an H100 pool of single-GPU engines takes the catalog's first H100 instance (one GPU each)"
  }

  assert {
    condition     = output.gpu_node_groups["eu-west/a100-0"].hosts == 2 && output.gpu_node_groups["eu-west/a100-0"].instance_type == "p4d.24xlarge" && output.gpu_node_groups["eu-west/a100-0"].engines_per_host == 8
    error_message = "9 A100s need two 8-GPU hosts, each running 8 single-GPU engines"
  }

  assert {
    condition     = output.gpu_node_groups["eu-west/a100-0"].capacity == null && output.gpu_node_groups["us-east/h100-0"].capacity == 2.5
    error_message = "no weight table: a pool's capacity_weight (per GPU) weighs each engine, else the router's prior does"
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

run "the_catalog_holds_every_current_aws_gpu_family" {
  command = plan

  assert {
    condition = alltrue([for family in ["p5", "p5e", "p5en", "p6-b200", "p4d", "p4de", "g6e", "g6", "g5", "g4dn"] : anytrue([
      for name in keys(output.instance_catalog) : split(".", name)[0] == family
    ])])
    error_message = "p5, p5e, p5en, p6-b200, p4d, p4de, g6e, g6, g5 and g4dn are all in fleet/aws_gpu_instances.json"
  }

  assert {
    condition = (
      output.instance_catalog["p5e.48xlarge"].gpu == "H200" && output.instance_catalog["p5e.48xlarge"].gpus == 8
      && output.instance_catalog["p6-b200.48xlarge"].gpu == "B200" && output.instance_catalog["p4de.24xlarge"].gpu_memory_gb == 80
      && output.instance_catalog["g6e.xlarge"].gpu == "L40S" && output.instance_catalog["g5.xlarge"].gpu == "A10G"
      && output.instance_catalog["g4dn.xlarge"].gpu == "T4" && output.instance_catalog["g6.xlarge"].gpu == "L4"
    )
    error_message = "each entry gives its GPU type, GPUs per instance and GPU memory"
  }

  assert {
    condition     = alltrue([for i in values(output.instance_catalog) : i.interconnect != "" && i.gpu_memory_gb > 0 && i.gpus >= 1])
    error_message = "every entry gives GPUs, GPU memory and interconnect"
  }
}

run "default_instances_hold_whole_engines" {
  command = plan

  variables {
    regions = {
      us-east = {
        aws_region   = "us-east-1"
        cidr_index   = 0
        jurisdiction = "us"
        azs          = ["us-east-1a", "us-east-1b", "us-east-1c"]
        neighbours   = []
        gpu_pools = [
          { gpu = "H200", count = 16, models = ["llama-3.1-70b"], tensor_parallel = 4 },
          { gpu = "H100", count = 8, models = ["big"], tensor_parallel = 8 },
          { gpu = "L40S", count = 4, models = ["llama-3.1-8b"] },
          { gpu = "A10G", count = 2, models = ["llama-3.1-8b"] },
          { gpu = "B200", count = 8, models = ["huge"], tensor_parallel = 4, pipeline_parallel = 2 },
          { gpu = "T4", count = 4, models = ["small"], tensor_parallel = 4 },
          { gpu = "L4", count = 2, models = ["small"], tensor_parallel = 2 },
        ]
      }
    }
  }

  assert {
    condition = {
      for k, g in output.gpu_node_groups : k => [g.instance_type, g.gpus_per_host, g.engines_per_host, g.hosts]
      } == {
      "us-east/h200-0" = ["p5e.48xlarge", 8, 2, 2]
      "us-east/h100-1" = ["p5.48xlarge", 8, 1, 1]
      "us-east/l40s-2" = ["g6e.xlarge", 1, 1, 4]
      "us-east/a10g-3" = ["g5.xlarge", 1, 1, 2]
      "us-east/b200-4" = ["p6-b200.48xlarge", 8, 1, 1]
      "us-east/t4-5"   = ["g4dn.12xlarge", 4, 1, 1]
      "us-east/l4-6"   = ["g6.12xlarge", 4, 2, 1]
    }
    error_message = "the default is the catalog's first instance of the GPU whose GPUs hold whole engines (tensor_parallel x pipeline_parallel each)"
  }
}

run "two_tp4_engines_on_a_p5e" {
  command = plan

  variables {
    regions = {
      us-east = {
        aws_region   = "us-east-1"
        cidr_index   = 0
        jurisdiction = "us"
        azs          = ["us-east-1a", "us-east-1b", "us-east-1c"]
        neighbours   = []
        gpu_pools = [{
          name            = "llama70b-h200"
          gpu             = "H200"
          count           = 16
          models          = ["llama-3.1-70b"]
          instance_type   = "p5e.48xlarge"
          gpus_per_host   = 8
          tensor_parallel = 4
          capacity_weight = 1.5
          engine = {
            kind     = "vllm"
            image    = "vllm/vllm-openai:v0.32.0"
            args     = ["--model", "meta-llama/Llama-3.1-70B-Instruct", "--tensor-parallel-size", "4"]
            hf_token = { source = "secretsmanager", name = "gpuroute/hf-token" }
          }
        }]
      }
    }
  }

  assert {
    condition     = output.gpu_node_groups["us-east/llama70b-h200"].engines_per_host == 2 && output.gpu_node_groups["us-east/llama70b-h200"].hosts == 2
    error_message = "16 H200s at TP4 on p5e.48xlarge: two hosts of two engines each"
  }

  assert {
    condition     = jsonencode([for e in output.gpu_node_groups["us-east/llama70b-h200"].engines : e.gpu_indices]) == "[[0,1,2,3],[4,5,6,7]]"
    error_message = "each engine on its own four GPUs"
  }

  assert {
    condition     = [for e in output.gpu_node_groups["us-east/llama70b-h200"].engines : [e.index, e.port, e.load_stream_port, e.admin_port]] == [[0, 8000, 7070, 7071], [1, 8001, 7072, 7073]]
    error_message = "each engine on its own port, with its own agent's load-stream and admin ports"
  }

  assert {
    condition     = output.gpu_node_groups["us-east/llama70b-h200"].capacity == 6 && output.gpu_node_groups["us-east/llama70b-h200"].engine.hf_token.name == "gpuroute/hf-token"
    error_message = "an engine weighs capacity_weight x its GPUs; the pool's engine passes through"
  }
}

run "an_instance_type_the_catalog_lacks_takes_the_pools_gpus_per_host" {
  command = plan

  variables {
    regions = {
      us-east = {
        aws_region   = "us-east-1"
        cidr_index   = 0
        jurisdiction = "us"
        azs          = ["us-east-1a", "us-east-1b", "us-east-1c"]
        neighbours   = []
        gpu_pools = [
          { gpu = "RTX-PRO-6000", count = 3, models = ["m"], instance_type = "g7e.2xlarge", gpus_per_host = 1 },
          { gpu = "H200-NVL", count = 8, models = ["m"], instance_type = "p5en.48xlarge", gpus_per_host = 8 },
        ]
      }
    }
  }

  assert {
    condition     = output.gpu_node_groups["us-east/rtx-pro-6000-0"].hosts == 3 && output.gpu_node_groups["us-east/rtx-pro-6000-0"].gpus_per_host == 1
    error_message = "a declared GPU type's own instance type, with its GPUs from the pool"
  }

  assert {
    condition     = output.gpu_node_groups["us-east/h200-nvl-1"].hosts == 1 && output.gpu_node_groups["us-east/h200-nvl-1"].engines_per_host == 8
    error_message = "a declared GPU type may name a catalog instance as its own (gpuroute tfvars checked it)"
  }
}

run "tp_that_does_not_divide_the_hosts_gpus_is_refused" {
  command = plan

  variables {
    regions = {
      us-east = {
        aws_region   = "us-east-1"
        cidr_index   = 0
        jurisdiction = "us"
        azs          = ["us-east-1a", "us-east-1b", "us-east-1c"]
        neighbours   = []
        gpu_pools    = [{ name = "odd", gpu = "H200", count = 6, models = ["m"], tensor_parallel = 3, instance_type = "p5e.48xlarge" }]
      }
    }
  }

  expect_failures = [output.gpu_node_groups]
}

run "a_gpu_without_an_instance_is_refused" {
  command = plan

  variables {
    regions = {
      us-east = {
        aws_region   = "us-east-1"
        cidr_index   = 0
        jurisdiction = "us"
        azs          = ["us-east-1a", "us-east-1b", "us-east-1c"]
        neighbours   = []
        gpu_pools    = [{ gpu = "MI300X", count = 8, models = ["m"] }]
      }
    }
  }

  expect_failures = [output.gpu_node_groups]
}

# A pool of count 0 gets no group: a GPU no instance carries is kept out, not refused
# (gpuroute check-config and tfvars skip it too).
run "a_pool_of_no_gpus_is_left_out_not_refused" {
  command = plan

  variables {
    regions = {
      us-east = {
        aws_region   = "us-east-1"
        cidr_index   = 0
        jurisdiction = "us"
        azs          = ["us-east-1a", "us-east-1b", "us-east-1c"]
        neighbours   = []
        gpu_pools    = [{ gpu = "MI300X", count = 0, models = ["m"] }, { gpu = "L40S", count = 1, models = ["m"] }]
      }
    }
  }

  assert {
    condition     = keys(output.gpu_node_groups) == ["us-east/l40s-1"]
    error_message = "the MI300X pool of no GPUs gets no group and no refusal"
  }
}

run "an_unknown_instance_without_gpus_per_host_is_refused" {
  command = plan

  variables {
    regions = {
      us-east = {
        aws_region   = "us-east-1"
        cidr_index   = 0
        jurisdiction = "us"
        azs          = ["us-east-1a", "us-east-1b", "us-east-1c"]
        neighbours   = []
        gpu_pools    = [{ gpu = "L4", count = 1, models = ["m"], instance_type = "g9.xlarge" }]
      }
    }
  }

  expect_failures = [output.gpu_node_groups]
}

run "an_instance_of_another_gpu_is_refused" {
  command = plan

  variables {
    regions = {
      us-east = {
        aws_region   = "us-east-1"
        cidr_index   = 0
        jurisdiction = "us"
        azs          = ["us-east-1a", "us-east-1b", "us-east-1c"]
        neighbours   = []
        gpu_pools    = [{ gpu = "L4", count = 8, models = ["m"], instance_type = "p5e.48xlarge" }]
      }
    }
  }

  expect_failures = [output.gpu_node_groups]
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
