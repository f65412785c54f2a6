# `terraform plan` of the whole example with the AWS provider mocked (no credentials, no
# account). The fleet is fleet.example.toml's, as `gpuroute tfvars` writes it: run
#   gpuroute tfvars ../../../../fleet.example.toml > terraform.tfvars.json
# first (tests/system/test_deploy.py does). Three regions; the 70B at TP4 on H200 (two
# engines per p5e.48xlarge) and on A100, the 8B on L40S and on A10G, an MoE under SGLang on
# a declared GPU type, one autoscaling pool. A second run swaps in pools whose tokens come
# from SSM and from a full ARN. Every secret below is a dummy of the right shape.

mock_provider "aws" {
  alias = "us_east"

  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }

  mock_data "aws_caller_identity" {
    defaults = { account_id = "123456789012" }
  }

  mock_data "aws_partition" {
    defaults = { partition = "aws" }
  }

  # the policy documents' JSON, which the mock cannot compute
  mock_data "aws_iam_policy_document" {
    defaults = { json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}" }
  }
}

mock_provider "aws" {
  alias = "eu_west"

  mock_data "aws_region" {
    defaults = { name = "eu-central-1" }
  }

  mock_data "aws_caller_identity" {
    defaults = { account_id = "123456789012" }
  }

  mock_data "aws_partition" {
    defaults = { partition = "aws" }
  }

  # the policy documents' JSON, which the mock cannot compute
  mock_data "aws_iam_policy_document" {
    defaults = { json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}" }
  }
}

mock_provider "aws" {
  alias = "ap_northeast"

  mock_data "aws_region" {
    defaults = { name = "ap-northeast-1" }
  }

  mock_data "aws_caller_identity" {
    defaults = { account_id = "123456789012" }
  }

  mock_data "aws_partition" {
    defaults = { partition = "aws" }
  }

  # the policy documents' JSON, which the mock cannot compute
  mock_data "aws_iam_policy_document" {
    defaults = { json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}" }
  }
}

variables {
  amis = {
    us-east      = { ami_id = "ami-0123456789abcdef0", gpu_ami_id = "ami-0fedcba9876543210" }
    eu-west      = { ami_id = "ami-0123456789abcdef1", gpu_ami_id = "ami-0fedcba9876543211" }
    ap-northeast = { ami_id = "ami-0123456789abcdef2", gpu_ami_id = "ami-0fedcba9876543212" }
  }
  tls_certificate_arns = {
    us-east      = "arn:aws:acm:us-east-1:123456789012:certificate/00000000-0000-0000-0000-000000000001"
    eu-west      = "arn:aws:acm:eu-central-1:123456789012:certificate/00000000-0000-0000-0000-000000000002"
    ap-northeast = "arn:aws:acm:ap-northeast-1:123456789012:certificate/00000000-0000-0000-0000-000000000003"
  }
  domain_name        = "api.inference.example.com"
  hosted_zone_id     = "Z0123456789ABCDEFGHIJ"
  client_cidrs       = ["0.0.0.0/0"]
  admin_cidrs        = ["10.200.0.0/16"]
  api_keys           = [{ sha256 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", tenant = "acme" }]
  gpuroute_wheel_url = "https://artifacts.example.internal/gpuroute/gpuroute-0.1.0-py3-none-any.whl"
  # dummies of the right shape (test only)
  consul_gossip_key          = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
  consul_acl_bootstrap_token = "00000000-0000-0000-0000-000000000001"
  consul_agent_token         = "00000000-0000-0000-0000-000000000002"
  consul_engine_token        = "00000000-0000-0000-0000-000000000003"
  consul_router_token        = "00000000-0000-0000-0000-000000000004"
  consul_global_token        = "00000000-0000-0000-0000-000000000005"
  consul_ca_pem              = "-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n"
  consul_server_certs = {
    us-east      = { cert = "test-cert", key = "test-key" }
    eu-west      = { cert = "test-cert", key = "test-key" }
    ap-northeast = { cert = "test-cert", key = "test-key" }
  }
  residency_decision_key = "0000000000000000000000000000000000000000000000000000000000000000"
  admin_token            = "1111111111111111111111111111111111111111111111111111111111111111"
  load_stream_token      = "2222222222222222222222222222222222222222222222222222222222222222"
}

run "the_fleet_plans" {
  command = plan

  assert {
    condition     = module.us_east[0].gpu_groups["us-east/llama70b-h200"].instance_type == "p5e.48xlarge" && [for e in module.us_east[0].gpu_groups["us-east/llama70b-h200"].engines : [e.port, join(",", e.gpu_indices)]] == [[8000, "0,1,2,3"], [8001, "4,5,6,7"]]
    error_message = "the 70B's hosts are p5e.48xlarge, each running two TP4 engines"
  }

  assert {
    condition     = module.us_east[0].gpu_groups["us-east/llama70b-h200"].min_size == 2 && module.us_east[0].gpu_groups["us-east/llama8b-l40s"].instance_type == "g6e.xlarge" && module.us_east[0].gpu_groups["us-east/llama8b-l40s"].max_size == 8
    error_message = "16 H200s are two hosts; 8 L40S are eight g6e.xlarge"
  }

  assert {
    condition     = module.eu_west[0].gpu_groups["eu-west/llama8b-l40s"].min_size == 4 && module.eu_west[0].gpu_groups["eu-west/llama8b-l40s"].max_size == 16 && module.eu_west[0].gpu_groups["eu-west/llama8b-l40s"].warm_pool.min_size == 2
    error_message = "the autoscaling pool spans 4 to 16 hosts with 2 warm"
  }

  assert {
    condition     = module.eu_west[0].gpu_groups["eu-west/qwen-moe-rtx"].instance_type == "g7e.2xlarge" && module.ap_northeast[0].gpu_groups["ap-northeast/llama70b-a100"].instance_type == "p4de.24xlarge" && module.ap_northeast[0].gpu_groups["ap-northeast/llama8b-a10g"].instance_type == "g5.xlarge"
    error_message = "the declared GPU type's own instance type; A100 80 GB and A10G from the catalog"
  }

  assert {
    condition     = jsonencode(module.us_east[0].engine_ports) == jsonencode({ engine = ["8000", "8001"], load_stream = ["7070", "7072"] }) && jsonencode(module.eu_west[0].engine_ports) == jsonencode({ engine = ["8000"], load_stream = ["7070"] })
    error_message = "routers reach each engine and each agent's load stream a region's hosts run, no more"
  }

  assert {
    condition = (
      jsonencode(module.us_east[0].gpu_token_arns) == jsonencode({ secretsmanager = ["arn:aws:secretsmanager:us-east-1:123456789012:secret:gpuroute/hf-token-??????"], ssm = [] })
      && jsonencode(module.eu_west[0].gpu_token_arns) == jsonencode({ secretsmanager = ["arn:aws:secretsmanager:eu-central-1:123456789012:secret:gpuroute/hf-token-??????"], ssm = [] })
      && jsonencode(module.ap_northeast[0].engine_ports) == jsonencode({ engine = ["8000", "8001"], load_stream = ["7070", "7072"] })
    )
    error_message = "the fleet file's one token reference, read in each region; the A100 hosts run two TP4 engines"
  }
}

# The same plan with pools whose tokens come from SSM and from a full Secrets Manager ARN:
# GPU hosts may read exactly the tokens their own region's pools name.
run "tokens_from_ssm_and_an_arn" {
  command = plan

  variables {
    regions = {
      us-east = {
        aws_region   = "us-east-1"
        cidr_index   = 0
        jurisdiction = "us"
        azs          = ["us-east-1a", "us-east-1b", "us-east-1c"]
        neighbours   = ["eu-west", "ap-northeast"]
        gpu_pools = [
          {
            name          = "llama70b-h200", gpu = "H200", count = 16, models = ["llama-3.1-70b"], zone = "us-east-1a"
            instance_type = "p5e.48xlarge", gpus_per_host = 8, tensor_parallel = 4, pipeline_parallel = 1
            engine = {
              kind     = "vllm"
              image    = "vllm/vllm-openai:v0.32.0"
              args     = ["--model", "meta-llama/Llama-3.1-70B-Instruct", "--served-model-name", "llama-3.1-70b", "--tensor-parallel-size", "4", "--pipeline-parallel-size", "1", "--max-model-len", "65536", "--quantization", "fp8", "--enable-prefix-caching"]
              hf_token = { source = "secretsmanager", name = "gpuroute/hf-token" }
            }
          },
          {
            name          = "llama8b-l40s", gpu = "L40S", count = 8, models = ["llama-3.1-8b"], zone = "us-east-1b"
            instance_type = "g6e.xlarge", gpus_per_host = 1, tensor_parallel = 1, pipeline_parallel = 1
            engine = {
              kind     = "vllm"
              image    = "vllm/vllm-openai:v0.32.0"
              args     = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama-3.1-8b", "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1", "--max-model-len", "32768"]
              hf_token = { source = "secretsmanager", name = "gpuroute/hf-token" }
            }
          },
        ]
      }
      eu-west = {
        aws_region   = "eu-central-1"
        cidr_index   = 1
        jurisdiction = "eu"
        azs          = ["eu-central-1a", "eu-central-1b", "eu-central-1c"]
        neighbours   = ["us-east", "ap-northeast"]
        gpu_pools = [
          {
            name          = "llama8b-l40s", gpu = "L40S", count = 8, models = ["llama-3.1-8b"], min_hosts = 4, max_hosts = 16, standby_hosts = 2
            instance_type = "g6e.xlarge", gpus_per_host = 1, tensor_parallel = 1, pipeline_parallel = 1
            engine = {
              kind     = "vllm"
              image    = "vllm/vllm-openai:v0.32.0"
              args     = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama-3.1-8b", "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1"]
              hf_token = { source = "ssm", name = "/gpuroute/hf-token" }
            }
          },
          {
            # a declared GPU type: its instance type is not in the catalog, so the pool says its GPUs
            name          = "qwen-moe-rtx", gpu = "RTX-PRO-6000", count = 4, models = ["qwen3-30b-a3b"]
            instance_type = "g7e.2xlarge", gpus_per_host = 1, tensor_parallel = 1, pipeline_parallel = 1
            engine = {
              kind     = "sglang"
              image    = "lmsysorg/sglang:v0.5.6"
              args     = ["--model-path", "Qwen/Qwen3-30B-A3B", "--served-model-name", "qwen3-30b-a3b", "--tp-size", "1", "--pp-size", "1", "--enable-metrics"]
              hf_token = null
            }
          },
        ]
      }
      ap-northeast = {
        aws_region   = "ap-northeast-1"
        cidr_index   = 2
        jurisdiction = "jp"
        azs          = ["ap-northeast-1a", "ap-northeast-1c", "ap-northeast-1d"]
        neighbours   = ["eu-west", "us-east"]
        gpu_pools = [
          {
            name          = "llama8b-a10g", gpu = "A10G", count = 8, models = ["llama-3.1-8b"]
            instance_type = "g5.xlarge", gpus_per_host = 1, tensor_parallel = 1, pipeline_parallel = 1
            engine = {
              kind     = "vllm"
              image    = "vllm/vllm-openai:v0.32.0"
              args     = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama-3.1-8b", "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1", "--max-model-len", "16384"]
              hf_token = { source = "secretsmanager", name = "gpuroute/hf-token" }
            }
          },
          {
            name = "llama70b-a100", gpu = "A100", count = 8, models = ["llama-3.1-70b"], instance_type = "p4de.24xlarge", tensor_parallel = 4
            engine = {
              kind     = "vllm"
              image    = "vllm/vllm-openai:v0.32.0"
              args     = ["--model", "meta-llama/Llama-3.1-70B-Instruct", "--served-model-name", "llama-3.1-70b", "--tensor-parallel-size", "4", "--pipeline-parallel-size", "1", "--quantization", "fp8"]
              hf_token = { source = "secretsmanager", name = "arn:aws:secretsmanager:ap-northeast-1:123456789012:secret:gpuroute/hf-token-AbCdEf" }
            }
          },
        ]
      }
    }
  }

  assert {
    condition = (
      jsonencode(module.us_east[0].gpu_token_arns) == jsonencode({ secretsmanager = ["arn:aws:secretsmanager:us-east-1:123456789012:secret:gpuroute/hf-token-??????"], ssm = [] })
      && jsonencode(module.eu_west[0].gpu_token_arns) == jsonencode({ secretsmanager = [], ssm = ["arn:aws:ssm:eu-central-1:123456789012:parameter/gpuroute/hf-token"] })
      && jsonencode(sort(module.ap_northeast[0].gpu_token_arns.secretsmanager)) == jsonencode(["arn:aws:secretsmanager:ap-northeast-1:123456789012:secret:gpuroute/hf-token-??????", "arn:aws:secretsmanager:ap-northeast-1:123456789012:secret:gpuroute/hf-token-AbCdEf"])
    )
    error_message = "GPU hosts may read exactly the tokens their region's pools name"
  }
}
