# One role per kind of host: each may describe instances (Consul's cloud auto-join) and read
# its own secrets from SSM (secrets.tf); beyond that, GPU hosts complete their group's drain
# hook and read the Hugging Face tokens their pools name, and regional routers write the
# desired-backends metric, nothing else.
data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  # the tokens the region's pools name (fleet file [secrets]): Secrets Manager secrets (any
  # version suffix of that name) and SSM parameters, in this account and region, or by ARN
  hf_tokens = distinct([for g in values(var.gpu_node_groups) : g.engine.hf_token if g.engine.hf_token != null])
  hf_token_arns = {
    for source in ["secretsmanager", "ssm"] : source => [
      for t in local.hf_tokens : startswith(t.name, "arn:") ? t.name : format(
        source == "ssm" ? "arn:%s:ssm:%s:%s:parameter/%s" : "arn:%s:secretsmanager:%s:%s:secret:%s-??????",
        data.aws_partition.current.partition, data.aws_region.current.name, data.aws_caller_identity.current.account_id, trimprefix(t.name, "/"),
      ) if t.source == source
    ]
  }
}

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "host" {
  for_each = local.secret_readers

  statement {
    actions   = ["ec2:DescribeInstances", "ec2:DescribeTags"]
    resources = ["*"]
  }

  statement {
    actions   = ["ssm:GetParameter"]
    resources = [for name in each.value : aws_ssm_parameter.secret[name].arn]
  }

  # GPU hosts: the lifecycle watcher completes the drain hook of this region's GPU groups
  # (it finds its group from the instance's aws:autoscaling:groupName tag, ec2:DescribeTags)
  dynamic "statement" {
    for_each = each.key == "gpu" && length(var.gpu_node_groups) > 0 ? [1] : []
    content {
      actions   = ["autoscaling:CompleteLifecycleAction"]
      resources = [for g in aws_autoscaling_group.gpu : g.arn]
    }
  }

  # GPU hosts: each engine reads its pool's Hugging Face token as it starts, and no other
  dynamic "statement" {
    for_each = each.key == "gpu" && length(local.hf_token_arns.secretsmanager) > 0 ? [1] : []
    content {
      actions   = ["secretsmanager:GetSecretValue"]
      resources = local.hf_token_arns.secretsmanager
    }
  }

  dynamic "statement" {
    for_each = each.key == "gpu" && length(local.hf_token_arns.ssm) > 0 ? [1] : []
    content {
      actions   = ["ssm:GetParameter"]
      resources = local.hf_token_arns.ssm
    }
  }

  # Regional routers: the CloudWatch agent sends the desired-backends metric as embedded
  # metric format logs (CloudWatch Logs, not PutMetricData) to its one log group
  dynamic "statement" {
    for_each = each.key == "regional" ? [1] : []
    content {
      actions   = ["logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"]
      resources = [aws_cloudwatch_log_group.router_metrics.arn, "${aws_cloudwatch_log_group.router_metrics.arn}:*"]
    }
  }
}

resource "aws_iam_role" "host" {
  for_each           = local.secret_readers
  name_prefix        = "gpuroute-${var.name}-${replace(each.key, "_", "-")}-"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = local.tags
}

resource "aws_iam_role_policy" "host" {
  for_each = local.secret_readers
  name     = "auto-join-and-secrets"
  role     = aws_iam_role.host[each.key].id
  policy   = data.aws_iam_policy_document.host[each.key].json
}

resource "aws_iam_instance_profile" "host" {
  for_each    = local.secret_readers
  name_prefix = "gpuroute-${var.name}-${replace(each.key, "_", "-")}-"
  role        = aws_iam_role.host[each.key].name
}
