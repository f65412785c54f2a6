"""The fleet file as a deployment: models and their weights, engines per pool, the AWS
instance catalog, the engine command lines and the Terraform variables rendered from it."""
