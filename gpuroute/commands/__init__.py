"""Root commands that read every tier's files (`check-config`, `tfvars`) or run the testbed
(`scale --local`): above the tiers, beside the demo."""
