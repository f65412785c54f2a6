# `terraform test` on the pure module: no provider, no cloud account. modules/region builds
# the auto-scaling groups, warm pools, lifecycle hooks and policies from these outputs.

variables {
  node_groups = {
    # a fixed group: no bounds given
    "us-east/a100-1" = { hosts = 1, models = ["llama-3.1-70b"] }
    # an autoscaling group with two warm hosts: the only group of us-east on its model
    "us-east/h100-0" = { hosts = 2, min_hosts = 1, max_hosts = 6, standby_hosts = 2, models = ["llama-3.1-8b"] }
    # autoscaling, no standby: the same model in another region is another pool
    "eu-west/l4-1" = { hosts = 8, min_hosts = 4, max_hosts = 16, models = ["llama-3.1-8b"] }
    # a fixed group may serve several models, and share them with other fixed groups
    "eu-west/a100-0" = { hosts = 1, models = ["llama-3.1-70b", "qwen-2.5-72b"] }
    "eu-west/h100-2" = { hosts = 1, models = ["qwen-2.5-72b"] }
  }
  drain = { timeout_s = 60 }
}

run "a_group_without_bounds_keeps_its_size" {
  command = plan

  assert {
    condition     = output.groups["us-east/a100-1"].min_size == 1 && output.groups["us-east/a100-1"].max_size == 1 && output.groups["us-east/a100-1"].desired_capacity == 1
    error_message = "min and max default to hosts: min = max = desired"
  }

  assert {
    condition     = output.groups["us-east/a100-1"].scaling_policy == null && output.groups["us-east/a100-1"].warm_pool == null
    error_message = "a fixed group has no policy and no warm pool"
  }
}

run "the_autoscaling_group_spans_min_to_max" {
  command = plan

  assert {
    condition     = output.groups["us-east/h100-0"].min_size == 1 && output.groups["us-east/h100-0"].max_size == 6 && output.groups["us-east/h100-0"].desired_capacity == 2
    error_message = "bounds from min_hosts and max_hosts; hosts is the size at creation"
  }

  assert {
    condition     = output.groups["us-east/h100-0"].pool == "llama-3.1-8b" && output.groups["eu-west/l4-1"].pool == "llama-3.1-8b"
    error_message = "the pool label is the model the group serves, as the routers export it"
  }

  assert {
    condition     = output.groups["us-east/a100-1"].pool == "llama-3.1-70b" && output.groups["eu-west/a100-0"].pool == null
    error_message = "a fixed group on one model is in that model's pool; one serving several is in none"
  }

  assert {
    condition     = output.groups["eu-west/a100-0"].scaling_policy == null && output.groups["eu-west/h100-2"].scaling_policy == null
    error_message = "fixed groups sharing a model have no policy, so they may share it"
  }

  assert {
    condition     = contains(output.enabled_metrics, "GroupInServiceInstances")
    error_message = "the policy divides by GroupInServiceInstances, which the group must publish"
  }
}

run "the_policy_follows_the_routers_desired_backends" {
  command = plan

  assert {
    condition     = output.groups["us-east/h100-0"].scaling_policy.policy_type == "TargetTrackingScaling" && output.groups["us-east/h100-0"].scaling_policy.target_value == 1
    error_message = "target tracking at 1.0: capacity equals the desired size"
  }

  assert {
    condition = output.groups["us-east/h100-0"].scaling_policy.desired == {
      id          = "desired"
      namespace   = "gpuroute"
      metric_name = "gpuroute_pool_desired_backends"
      dimensions  = { pool = "llama-3.1-8b" }
      stat        = "Maximum"
    }
    error_message = "the routers' metric for the group's model, the Maximum over routers (they all export the same number)"
  }

  assert {
    condition     = output.groups["us-east/h100-0"].scaling_policy.in_service.metric_name == "GroupInServiceInstances" && output.groups["us-east/h100-0"].scaling_policy.in_service.namespace == "AWS/AutoScaling"
    error_message = "divided by the group's hosts in service"
  }

  assert {
    condition     = output.groups["us-east/h100-0"].scaling_policy.expression == "desired / (in_service * 1)"
    error_message = "the tracked value is desired backends per host in service"
  }

  assert {
    condition     = output.metric == { namespace = "gpuroute", name = "gpuroute_pool_desired_backends", dimension = "pool" }
    error_message = "the routers' CloudWatch agent publishes the metric the policies read"
  }

  assert {
    condition     = output.groups["eu-west/l4-1"].scaling_policy.desired.dimensions == { pool = "llama-3.1-8b" } && output.groups["eu-west/l4-1"].scaling_policy.estimated_instance_warmup == 600
    error_message = "each group tracks its model's pool (CloudWatch is per AWS region: the eu-west routers' llama-3.1-8b)"
  }
}

run "standby_hosts_become_a_running_warm_pool" {
  command = plan

  assert {
    condition = output.groups["us-east/h100-0"].warm_pool == {
      pool_state                  = "Running"
      min_size                    = 2
      max_group_prepared_capacity = 3
      reuse_on_scale_in           = false
    }
    error_message = "two running standby hosts whatever the desired size; hosts leave through the drain hook, not back into the pool"
  }

  assert {
    condition     = output.groups["eu-west/l4-1"].warm_pool == null
    error_message = "no standby hosts, no warm pool"
  }
}

run "the_drain_hook_outlasts_the_agents_drain" {
  command = plan

  assert {
    condition     = output.lifecycle_hook.lifecycle_transition == "autoscaling:EC2_INSTANCE_TERMINATING" && output.lifecycle_hook.default_result == "CONTINUE"
    error_message = "a terminating hook that lets the host go if the watcher never completes it"
  }

  assert {
    condition     = output.lifecycle_hook.heartbeat_timeout == 60 + 1 + 60 && output.lifecycle_hook.name == "gpuroute-drain"
    error_message = "heartbeat = drain timeout + grace + margin"
  }
}

run "a_longer_drain_lengthens_the_hook" {
  command = plan

  variables {
    drain = { timeout_s = 900, grace_s = 5, margin_s = 120 }
  }

  assert {
    condition     = output.lifecycle_hook.heartbeat_timeout == 1025
    error_message = "the hook's timeout follows the agent's drain timeout"
  }
}

run "min_above_max_is_rejected" {
  command = plan

  variables {
    node_groups = { "us-east/h100-0" = { hosts = 2, min_hosts = 4, max_hosts = 3, models = ["m"] } }
  }

  expect_failures = [var.node_groups]
}

run "standby_beyond_what_the_group_can_grow_by_is_rejected" {
  command = plan

  variables {
    node_groups = { "us-east/h100-0" = { hosts = 2, min_hosts = 1, max_hosts = 3, standby_hosts = 3, models = ["m"] } }
  }

  expect_failures = [var.node_groups]
}

run "standby_on_a_fixed_group_is_rejected" {
  command = plan

  variables {
    node_groups = { "us-east/h100-0" = { hosts = 2, standby_hosts = 1, models = ["m"] } }
  }

  expect_failures = [var.node_groups]
}

run "hosts_outside_the_bounds_are_rejected" {
  command = plan

  variables {
    node_groups = { "eu-west/l4-0" = { hosts = 16, min_hosts = 1, max_hosts = 4, models = ["m"] } }
  }

  expect_failures = [var.node_groups]
}

run "a_group_that_can_reach_zero_is_rejected" {
  command = plan

  variables {
    node_groups = { "eu-west/l4-0" = { hosts = 1, min_hosts = 0, max_hosts = 4, models = ["m"] } }
  }

  expect_failures = [var.node_groups]
}

run "fractional_hosts_are_rejected" {
  command = plan

  variables {
    node_groups = { "eu-west/l4-0" = { hosts = 2, min_hosts = 1, max_hosts = 4.5, models = ["m"] } }
  }

  expect_failures = [var.node_groups]
}

run "a_drain_longer_than_a_hook_can_wait_is_rejected" {
  command = plan

  variables {
    drain = { timeout_s = 7200 }
  }

  expect_failures = [var.drain]
}

run "an_autoscaling_group_serving_two_models_is_rejected" {
  command = plan

  variables {
    node_groups = { "us-east/h100-0" = { hosts = 2, min_hosts = 1, max_hosts = 6, models = ["llama-3.1-8b", "llama-3.1-70b"] } }
  }

  expect_failures = [var.node_groups]
}

run "an_autoscaling_group_serving_no_model_is_rejected" {
  command = plan

  variables {
    node_groups = { "us-east/h100-0" = { hosts = 2, min_hosts = 1, max_hosts = 6, models = [] } }
  }

  expect_failures = [var.node_groups]
}

run "a_fixed_group_on_the_model_of_an_autoscaling_group_is_rejected" {
  command = plan

  variables {
    node_groups = {
      "eu-west/a100-0" = { hosts = 1, models = ["llama-3.1-8b", "llama-3.1-70b"] }
      "eu-west/l4-1"   = { hosts = 8, min_hosts = 4, max_hosts = 16, models = ["llama-3.1-8b"] }
    }
  }

  expect_failures = [var.node_groups]
}

run "two_autoscaling_groups_on_one_model_are_rejected" {
  command = plan

  variables {
    node_groups = {
      "eu-west/l4-0" = { hosts = 8, min_hosts = 4, max_hosts = 16, models = ["llama-3.1-8b"] }
      "eu-west/l4-1" = { hosts = 2, min_hosts = 1, max_hosts = 4, models = ["llama-3.1-8b"] }
    }
  }

  expect_failures = [var.node_groups]
}

run "a_group_with_standby_hosts_on_a_shared_model_is_rejected" {
  command = plan

  variables {
    node_groups = {
      "eu-west/a100-0" = { hosts = 1, models = ["llama-3.1-8b"] }
      "eu-west/l4-1"   = { hosts = 4, min_hosts = 4, max_hosts = 8, standby_hosts = 1, models = ["llama-3.1-8b"] }
    }
  }

  expect_failures = [var.node_groups]
}

run "a_key_without_its_region_is_rejected" {
  command = plan

  variables {
    node_groups = { "l4-1" = { hosts = 1, models = ["llama-3.1-8b"] } }
  }

  expect_failures = [var.node_groups]
}

# Two TP4 engines per 8-GPU host: the routers' desired backends are engines, so the policy
# divides by the engines in service, hosts in service x 2.
run "a_host_of_two_engines_counts_twice" {
  command = plan

  variables {
    node_groups = {
      "us-east/llama70b-h200" = { models = ["llama-3.1-70b"], hosts = 2, min_hosts = 1, max_hosts = 4, engines_per_host = 2 }
      "us-east/llama8b-l40s"  = { models = ["llama-3.1-8b"], hosts = 4, min_hosts = 2, max_hosts = 8 }
    }
  }

  assert {
    condition     = output.groups["us-east/llama70b-h200"].scaling_policy.expression == "desired / (in_service * 2)"
    error_message = "a host of two engines must count as two backends in service"
  }

  assert {
    condition     = output.groups["us-east/llama8b-l40s"].scaling_policy.expression == "desired / (in_service * 1)"
    error_message = "a host of one engine counts once"
  }
}
