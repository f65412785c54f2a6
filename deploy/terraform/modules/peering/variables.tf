variable "requester" {
  description = "Requesting side: gpuroute region name, VPC id, CIDR and private route table."
  type = object({
    name           = string
    vpc_id         = string
    cidr           = string
    route_table_id = string
  })
}

variable "accepter" {
  description = "Accepting side: gpuroute region name, AWS region, VPC id, CIDR and private route table."
  type = object({
    name           = string
    aws_region     = string
    vpc_id         = string
    cidr           = string
    route_table_id = string
  })
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
