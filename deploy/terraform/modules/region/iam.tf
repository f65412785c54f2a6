# Hosts need ec2:DescribeInstances for Consul's cloud auto-join, nothing else.
data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "auto_join" {
  statement {
    actions   = ["ec2:DescribeInstances", "ec2:DescribeTags"]
    resources = ["*"]
  }
}

resource "aws_iam_role" "host" {
  name_prefix        = "gpuroute-${var.name}-"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = local.tags
}

resource "aws_iam_role_policy" "auto_join" {
  name   = "consul-auto-join"
  role   = aws_iam_role.host.id
  policy = data.aws_iam_policy_document.auto_join.json
}

resource "aws_iam_instance_profile" "host" {
  name_prefix = "gpuroute-${var.name}-"
  role        = aws_iam_role.host.name
}
