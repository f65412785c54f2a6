run "consul_server_joins_by_tag_and_federates" {
  command = plan

  assert {
    condition     = strcontains(output.consul_server, "retry_join       = [\"provider=aws tag_key=gpuroute-consul tag_value=gpuroute-consul-eu-west\"]")
    error_message = "servers find each other by tag"
  }

  assert {
    condition     = strcontains(output.consul_server, "retry_join_wan   = [\"10.64.128.10\",\"10.64.144.10\"]")
    error_message = "federating servers WAN-join the other regions' servers"
  }

  assert {
    condition     = strcontains(output.consul_server, "default_policy           = \"deny\"") && strcontains(output.consul_server, "bootstrap_expect = 3")
    error_message = "ACLs deny by default; three servers bootstrap"
  }
}

run "gpu_node_runs_engines_consul_and_agents" {
  command = plan

  assert {
    condition     = strcontains(output.gpu_node, "[telemetry]\nsource = \"nvml\"\ngpu_indices = [0,1,2,3]\n") && strcontains(output.gpu_node, "models = [\"llama-3.1-70b\",\"llama-70b\"]") && strcontains(output.gpu_node, "tensor_parallel = 4\npipeline_parallel = 1\n")
    error_message = "each agent reads NVML for its own GPUs and advertises the pool's models and parallelism"
  }

  assert {
    condition     = !strcontains(output.gpu_node, "capacity =") && strcontains(output.gpu_node_sglang, "capacity = 0.4\n")
    error_message = "capacity only where the pool weighs its engines (else the router's prior for the GPU)"
  }

  assert {
    condition     = strcontains(output.gpu_node, "cat > /etc/systemd/system/gpuroute-agent@.service <<'UNIT'") && strcontains(output.gpu_node, "ExecStart=/opt/gpuroute/bin/gpuroute agent --config /etc/gpuroute/agent-%i.toml") && strcontains(output.gpu_node, "TimeoutStopSec=%s\\n' \"$(( 60 + 30 ))\"")
    error_message = "the agents run from the shipped unit, as a template per engine, with a stop timeout above the drain timeout"
  }

  assert {
    condition     = strcontains(output.gpu_node, "tokens { agent = \"$AGENT_TOKEN\" }") && strcontains(output.gpu_node, "secret consul/agent-token")
    error_message = "the Consul client agent's ACL token comes from SSM at boot, and is no default token"
  }
}

run "engines_are_packed_each_on_its_own_gpus_and_port" {
  command = plan

  assert {
    condition = strcontains(output.gpu_node, join(" ", [
      "ExecStart=/usr/bin/docker run --rm --name engine-0 --gpus '\"device=0,1,2,3\"' --ipc=host -p 8000:8000",
      "-v /opt/gpuroute/models:/root/.cache/huggingface --env-file /run/gpuroute-engine-0/hf-token.env vllm/vllm-openai:v0.32.0",
      "--model meta-llama/Llama-3.1-70B-Instruct --served-model-name llama-3.1-70b llama-70b --tensor-parallel-size 4",
      "--pipeline-parallel-size 1 --quantization fp8 --override-generation-config \"{\\\"temperature\\\": 0.5}\" --host 0.0.0.0 --port 8000\n",
    ]))
    error_message = "engine 0 runs the pool's image and arguments on GPUs 0-3, port 8000, with the weights cached under /opt/gpuroute/models"
  }

  assert {
    condition     = strcontains(output.gpu_node, "--name engine-1 --gpus '\"device=4,5,6,7\"' --ipc=host -p 8001:8001") && strcontains(output.gpu_node, "--quantization fp8 --override-generation-config \"{\\\"temperature\\\": 0.5}\" --host 0.0.0.0 --port 8001\n")
    error_message = "engine 1 runs the same arguments on GPUs 4-7, port 8001"
  }

  assert {
    condition     = length(regexall("cat > /etc/systemd/system/gpuroute-engine-[0-9]+.service", output.gpu_node)) == 2 && length(regexall("cat > /etc/gpuroute/agent-[0-9]+.toml", output.gpu_node)) == 2
    error_message = "one engine unit and one agent config per engine"
  }

  assert {
    condition     = strcontains(output.gpu_node, "id = \"$(hostname)-1\"") && strcontains(output.gpu_node, "url = \"http://127.0.0.1:8001\"") && strcontains(output.gpu_node, "[load_stream]\nhost = \"0.0.0.0\"\nport = 7072\n") && strcontains(output.gpu_node, "[admin]\nhost = \"127.0.0.1\"\nport = 7073\n") && strcontains(output.gpu_node, "gpu_indices = [4,5,6,7]")
    error_message = "agent 1 registers its own id and engine port, with its own load-stream and admin ports and GPUs"
  }

  assert {
    condition     = strcontains(output.gpu_node, "systemctl enable --now gpuroute-engine-0 gpuroute-agent@0 gpuroute-engine-1 gpuroute-agent@1 gpuroute-lifecycle")
    error_message = "every engine and its agent start at boot"
  }

  assert {
    condition     = strcontains(output.gpu_node, "mount -o noatime \"$STORE\" \"$MODELS\"") && strcontains(output.gpu_node, "Amazon EC2 NVMe Instance Storage")
    error_message = "the weights' cache is on the NVMe instance store when the host has one"
  }
}

run "the_hf_token_is_read_at_engine_start_never_in_user_data" {
  command = plan

  assert {
    condition     = strcontains(output.gpu_node, "ExecStartPre=/usr/local/bin/gpuroute-hf-token /run/gpuroute-engine-1/hf-token.env") && strcontains(output.gpu_node, "RuntimeDirectory=gpuroute-engine-1\nRuntimeDirectoryMode=0700\n")
    error_message = "each engine reads the token as it starts, into its own runtime directory"
  }

  assert {
    condition     = strcontains(output.gpu_node, "aws secretsmanager get-secret-value --region eu-central-1 --secret-id 'gpuroute/hf-token' --query SecretString --output text") && strcontains(output.gpu_node, "cat > /usr/local/bin/gpuroute-hf-token <<'SCRIPT'\n#!/bin/bash\nset -euo pipefail\numask 077\n")
    error_message = "a Secrets Manager token is fetched by name, into a file only root reads"
  }

  assert {
    condition     = strcontains(output.gpu_node_sglang, "aws ssm get-parameter --region eu-central-1 --with-decryption --name '/gpuroute/hf-token' --query Parameter.Value --output text") && !strcontains(output.gpu_node_sglang, "secretsmanager")
    error_message = "an SSM token is fetched (decrypted) by name"
  }

  assert {
    condition     = !strcontains(output.gpu_node_public_model, "hf-token") && !strcontains(output.gpu_node_public_model, "--env-file")
    error_message = "a pool without a token reads none"
  }
}

run "declared_gpu_types_reach_agents_and_routers" {
  command = plan

  assert {
    condition     = strcontains(output.gpu_node_sglang, "gpu = \"RTX-PRO-6000\"") && strcontains(output.gpu_node_sglang, "[[gpu_types]]\ndevice_names = [\"NVIDIA RTX PRO 6000 Blackwell Server Edition\"]\nfp16_tflops = 500\nfp8_tflops = 1000\nmemory_bandwidth_tbs = 1.79\nmemory_gb = 96\nname = \"RTX-PRO-6000\"\nprice_per_hour = 3.4\nTOML\n")
    error_message = "an agent on a declared GPU type declares it (the keys left null stay out)"
  }

  assert {
    condition     = strcontains(output.router, "[[gpu_types]]\n") && strcontains(output.router, "name = \"RTX-PRO-6000\"") && !strcontains(output.gpu_node, "[[gpu_types]]")
    error_message = "routers know the declared types their engines register with; built-in types need nothing"
  }
}

run "an_sglang_pool_runs_sglang" {
  command = plan

  assert {
    condition     = strcontains(output.gpu_node_sglang, "lmsysorg/sglang:v0.5.6 python3 -m sglang.launch_server --model-path Qwen/Qwen3-30B-A3B --served-model-name qwen3-30b-a3b --tp-size 1 --pp-size 1 --enable-metrics --host 0.0.0.0 --port 8000\n")
    error_message = "SGLang's server with the pool's arguments, on the engine's port"
  }

  assert {
    condition     = strcontains(output.gpu_node_sglang, "kind = \"sglang\"") && strcontains(output.gpu_node_sglang, "--gpus '\"device=0\"'") && !strcontains(output.gpu_node_sglang, "vllm")
    error_message = "its agent knows the engine kind"
  }
}

run "router_requires_keys_and_reports_its_region" {
  command = plan

  assert {
    condition     = strcontains(output.router, "[auth]\nallow_anonymous = false") && strcontains(output.router, "tenant = \"acme-eu\"\nresidency = [\"eu\"]")
    error_message = "routers require the listed API keys"
  }

  assert {
    condition     = strcontains(output.router, "[region.report_listen]\nhost = \"0.0.0.0\"\nport = 7080") && !strcontains(output.global, "[membership]")
    error_message = "routers report their region; the global tier has its own config"
  }
}

run "router_keeps_admin_off_the_public_port" {
  command = plan

  assert {
    condition     = strcontains(output.router, "[admin_listen]\nhost = \"0.0.0.0\"\nport = 9090") && strcontains(output.router, "[listen]\nhost = \"0.0.0.0\"\nport = 8080")
    error_message = "API on 8080, admin and /readyz on 9090"
  }

  assert {
    condition     = strcontains(output.router, "consul = \"http://127.0.0.1:8500\"")
    error_message = "the router discovers engines through its local Consul agent"
  }
}

run "hosts_install_by_hash_and_verify_consul" {
  command = plan

  assert {
    condition     = strcontains(output.router, "pip install --quiet --require-hashes -r /etc/gpuroute/requirements.lock") && strcontains(output.router, "pip install --quiet --no-deps 'https://artifacts.example.internal/")
    error_message = "dependencies by hash from the lock; gpuroute's wheel from the operator's store"
  }

  assert {
    condition     = strcontains(output.consul_server, "gpg --batch --verify") && strcontains(output.gpu_node, "sha256sum -c -")
    error_message = "Consul's download is checked against HashiCorp's signed SHA256SUMS"
  }
}

run "secrets_come_from_ssm_never_user_data" {
  command = plan

  assert {
    condition     = strcontains(output.router, "secret consul/router-token") && strcontains(output.global, "secret consul/global-token") && strcontains(output.consul_server, "secret consul/bootstrap-token")
    error_message = "each role fetches its own Consul token from SSM"
  }

  assert {
    condition     = strcontains(output.router, "token_file = \"/etc/gpuroute/consul-token\"") && !strcontains(output.router, "secret consul/agent-token\nROUTER")
    error_message = "gpuroute reads its token from a file written at boot"
  }

  assert {
    condition     = strcontains(output.gpu_node, "secret consul/engine-token > /etc/gpuroute/consul-token") && !strcontains(output.gpu_node, "\"$AGENT_TOKEN\" > /etc/gpuroute") && !strcontains(output.router, "consul/engine-token") && !strcontains(output.global, "consul/engine-token")
    error_message = "only GPU hosts' agents hold the token that registers engines; Consul client agents' own token writes no service"
  }

  assert {
    condition     = strcontains(output.gpu_node, "secret gpuroute/load-stream-token") && strcontains(output.gpu_node, "port = 7070\ntoken_file = \"/etc/gpuroute/load-stream-token\"") && strcontains(output.gpu_node, "port = 7072\ntoken_file = \"/etc/gpuroute/load-stream-token\"")
    error_message = "agents' load streams answer only routers holding the load-stream token, from SSM"
  }

  assert {
    condition     = strcontains(output.router, "secret gpuroute/load-stream-token") && strcontains(output.router, "load_stream_token_file = \"/etc/gpuroute/load-stream-token\"")
    error_message = "routers take an agent's load report only with its proof under the same token"
  }
}

run "consul_rpc_is_tls_with_auto_encrypt" {
  command = plan

  assert {
    condition     = strcontains(output.consul_server, "verify_incoming = true") && strcontains(output.consul_server, "auto_encrypt { allow_tls = true }") && strcontains(output.consul_server, "secret consul/server-key")
    error_message = "servers verify every RPC caller and hand client agents their certificates"
  }

  assert {
    condition     = strcontains(output.gpu_node, "auto_encrypt { tls = true }") && strcontains(output.gpu_node, "verify_server_hostname = true")
    error_message = "client agents verify the servers and get their certificates by auto-encrypt"
  }
}

run "routers_serve_only_signed_decisions" {
  command = plan

  assert {
    condition     = strcontains(output.router, "require_global_decision = true") && strcontains(output.router, "secret gpuroute/decision-key") && strcontains(output.global, "decision_key_file = \"/etc/gpuroute/decision-key\"")
    error_message = "the global tier signs residency decisions and routers require them"
  }
}

run "admin_ports_ask_for_the_admin_token" {
  command = plan

  assert {
    condition     = strcontains(output.router, "secret gpuroute/admin-token") && strcontains(output.router, "admin_token_file = \"/etc/gpuroute/admin-token\"") && strcontains(output.global, "secret gpuroute/admin-token") && strcontains(output.global, "admin_token_file = \"/etc/gpuroute/admin-token\"")
    error_message = "routers and the global tier bind their admin port off loopback, so it must ask for the admin token"
  }
}

run "routers_trust_the_global_tiers_forwarding" {
  command = plan

  assert {
    condition     = strcontains(output.router, "trusted_proxies = [\"10.65.0.0/16\",\"10.64.0.0/16\"]")
    error_message = "routers read the client from the global tier's X-Forwarded-For and cap per client, not per global-tier host"
  }
}

run "the_global_tier_refuses_keys_it_does_not_list" {
  command = plan

  assert {
    condition     = strcontains(output.global, "refuse_unknown_keys = true")
    error_message = "the global tier holds every key, so an unknown one is refused before its body is read"
  }
}

run "gpu_nodes_follow_their_autoscaling_lifecycle" {
  command = plan

  assert {
    condition     = strcontains(output.gpu_node, "Warmed:Running) agents standby ;;") && strcontains(output.gpu_node, "InService) agents activate ;;") && strcontains(output.gpu_node, "autoscaling/target-lifecycle-state")
    error_message = "the lifecycle watcher puts a warm-pool host's agents in standby and activates them in service, from IMDS"
  }

  assert {
    condition     = strcontains(output.gpu_node, "Environment=LIFECYCLE_HOOK=gpuroute-drain") && strcontains(output.gpu_node, "--lifecycle-action-result CONTINUE --lifecycle-hook-name \"$HOOK\"")
    error_message = "a leaving host drains, then completes the drain hook"
  }

  assert {
    condition     = strcontains(output.gpu_node, "systemctl enable --now gpuroute-engine-0 gpuroute-agent@0 gpuroute-engine-1 gpuroute-agent@1 gpuroute-lifecycle") && strcontains(output.gpu_node, "User=gpuroute")
    error_message = "the watcher runs as a service, unprivileged"
  }

  assert {
    condition     = strcontains(output.gpu_node, "Environment=\"AGENTS=0 1\"") && strcontains(output.gpu_node, "After=gpuroute-agent@0.service gpuroute-agent@1.service")
    error_message = "the watcher drives every agent of the host"
  }

  assert {
    condition     = !strcontains(output.gpu_node, "standby =")
    error_message = "agent.toml has no standby key: the watcher tells the agent"
  }
}

run "routers_publish_the_desired_backends_to_cloudwatch" {
  command = plan

  assert {
    condition     = strcontains(output.router, "\"regex\": \"gpuroute_pool_desired_backends\", \"action\": \"keep\"") && strcontains(output.router, "\"dimensions\": [[\"pool\"]]")
    error_message = "the CloudWatch agent keeps the desired-backends metric alone, by pool"
  }

  assert {
    condition     = strcontains(output.router, "\"credentials_file\": \"/etc/gpuroute/admin-token\"") && strcontains(output.router, "\"targets\": [\"127.0.0.1:9090\"]")
    error_message = "it scrapes the admin listener's /metrics with the admin token"
  }

  assert {
    condition     = strcontains(output.router, "\"metric_namespace\": \"gpuroute\"") && strcontains(output.router, "\"log_group_name\": \"/gpuroute/eu-west/router-metrics\"")
    error_message = "into the namespace the policies read, through the router-metrics log group"
  }

  assert {
    condition     = strcontains(output.router, "937616F3450B7D806CBD9725D58167303B789C72") && strcontains(output.router, "gpg --batch --verify amazon-cloudwatch-agent.deb.sig amazon-cloudwatch-agent.deb")
    error_message = "the agent's package is verified against AWS's pinned signing key"
  }

  assert {
    condition     = !strcontains(output.global, "amazon-cloudwatch-agent")
    error_message = "the global tier exports no pool sizes"
  }
}

run "user_data_fits_ec2_and_installs_the_checked_lock" {
  command = plan

  assert {
    condition     = alltrue([for script in [output.consul_server, output.router, output.global, output.gpu_node, output.gpu_node_sglang, output.gpu_node_public_model, output.gpu_node_eight_engines] : length(base64gzip(script)) <= 16384])
    error_message = "EC2 takes 16 KB of user data: every script, gzipped and base64-encoded as Terraform sends it, stays under it"
  }

  assert {
    condition     = strcontains(output.gpu_node_eight_engines, "curl -fsSL --proto '=https' -o /etc/gpuroute/requirements.lock 'https://artifacts.example.internal/gpuroute/requirements.lock'\necho '${filesha256("../../../../requirements.lock")}  /etc/gpuroute/requirements.lock' | sha256sum --check --quiet -\n") && !strcontains(output.router, "--hash=sha256:")
    error_message = "hosts download requirements.lock and check it against the repository's own sha256; the lock itself is not in user data"
  }
}

run "routers_get_the_fleets_models" {
  command = plan

  assert {
    condition     = strcontains(output.router, "[[models]]\nfallback = [\"llama-3.1-8b\"]\nname = \"llama-3.1-70b\"\nslo_class = \"interactive\"\n") && strcontains(output.router, "[[models]]\naliases = [\"llama-8b\",\"small\"]\nname = \"llama-3.1-8b\"\nsplit = { \"llama-3.1-8b@v1\" = 90, \"llama-3.1-8b@v2\" = 10 }\n")
    error_message = "each model's fallback, SLO class, aliases and split reach router.toml as TOML"
  }

  assert {
    condition     = !strcontains(output.router, "config_json") && !strcontains(output.router, "/etc/gpuroute/models/")
    error_message = "no config.json is written or named when no model has one"
  }
}
