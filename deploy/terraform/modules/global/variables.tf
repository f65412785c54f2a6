variable "domain_name" {
  description = "The one global endpoint clients use, e.g. api.inference.example.com."
  type        = string
}

variable "hosted_zone_id" {
  description = "Route 53 hosted zone that holds domain_name."
  type        = string
}

variable "endpoints" {
  description = "Global-tier load balancers by gpuroute region: AWS region (for latency routing), DNS name and hosted zone of the NLB (region module output global_endpoint)."
  type = map(object({
    aws_region = string
    dns_name   = string
    zone_id    = string
  }))

  validation {
    condition     = length(var.endpoints) >= 2
    error_message = "Run the global tier in at least two regions: one region's outage must not take the endpoint down."
  }
}

variable "health_check" {
  description = "Route 53 health check of each global endpoint: port and path (the router's /readyz), and how quickly a failing region leaves DNS."
  type = object({
    port              = number
    path              = string
    protocol          = string
    failure_threshold = number
    request_interval  = number
  })
  default = {
    port              = 443
    path              = "/readyz"
    protocol          = "HTTPS"
    failure_threshold = 2
    request_interval  = 10
  }

  validation {
    condition     = contains(["HTTP", "HTTPS"], var.health_check.protocol) && contains([10, 30], var.health_check.request_interval)
    error_message = "protocol must be HTTP or HTTPS; request_interval 10 or 30 (Route 53's choices)."
  }
}


variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
