# One role per kind of host: each may describe instances (Consul's cloud auto-join) and read
# its own secrets from SSM (secrets.tf); beyond that, GPU hosts complete their group's drain
# hook and regional routers write the desired-backends metric, nothing else.
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
