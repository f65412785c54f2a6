# One role per kind of host: each may describe instances (Consul's cloud auto-join) and read
# its own secrets from SSM (secrets.tf), nothing else.
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
