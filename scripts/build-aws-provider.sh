#!/usr/bin/env bash
# Terraform's AWS provider for the deployment tests (`terraform init -plugin-dir=DIR`, then
# `validate` and the mocked plan of examples/multi-region); prints DIR, laid out as
#   DIR/registry.terraform.io/hashicorp/aws/VERSION/linux_amd64/terraform-provider-aws_vVERSION_x5
# Looked for, in order: $GPUROUTE_TF_PLUGIN_DIR, /opt/tf-plugins (build images carry one),
# a build cached under ~/.cache/gpuroute/tf-plugins. Building it from the Go module proxy is
# very heavy (several GB of modules, a ~700 MB binary, most of an hour on 2 cores), so it is
# done only with GPUROUTE_BUILD_AWS_PROVIDER=1; otherwise this says what is missing and exits 1.
#
# The provider's v5 tags are not Go module versions (its module path has no /v5), so the
# proxy serves a release as its tag's commit: set GPUROUTE_AWS_PROVIDER_COMMIT to the commit
# of tag vVERSION (`git ls-remote https://github.com/hashicorp/terraform-provider-aws
# refs/tags/v5.100.0`), which Go resolves to a pseudo-version.
set -euo pipefail
VERSION="${GPUROUTE_AWS_PROVIDER_VERSION:-5.100.0}"
MODULE=github.com/hashicorp/terraform-provider-aws
CACHE="${GPUROUTE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuroute}"
BUILT="$CACHE/tf-plugins"
BINARY="registry.terraform.io/hashicorp/aws/$VERSION/linux_amd64/terraform-provider-aws_v${VERSION}_x5"

# a plugin dir holding some AWS provider release (the modules take >= 5.40, < 7.0)
holds_aws() { compgen -G "$1/registry.terraform.io/hashicorp/aws/*/linux_amd64/terraform-provider-aws_v*" >/dev/null; }
for dir in "${GPUROUTE_TF_PLUGIN_DIR:-}" /opt/tf-plugins; do
    if [ -n "$dir" ] && holds_aws "$dir"; then echo "$dir"; exit 0; fi
done
if [ -x "$BUILT/$BINARY" ]; then echo "$BUILT"; exit 0; fi

if [ "${GPUROUTE_BUILD_AWS_PROVIDER:-}" != 1 ]; then
    cat >&2 <<EOF
build-aws-provider: no AWS provider for Terraform: none in \$GPUROUTE_TF_PLUGIN_DIR (${GPUROUTE_TF_PLUGIN_DIR:-unset}),
/opt/tf-plugins or $BUILT. Either point GPUROUTE_TF_PLUGIN_DIR at a plugin dir holding
registry.terraform.io/hashicorp/aws/VERSION/linux_amd64/terraform-provider-aws_vVERSION_x5 (for
example HashiCorp's release zip of terraform-provider-aws $VERSION unpacked there), or build
$VERSION from the Go module proxy (very heavy: several GB, most of an hour) with
GPUROUTE_BUILD_AWS_PROVIDER=1 GPUROUTE_AWS_PROVIDER_COMMIT=<commit of tag v$VERSION> $0
Without it the tests that need the provider (terraform validate of the AWS modules, the mocked
plan of examples/multi-region) skip, saying why.
EOF
    exit 1
fi
if [ -z "${GPUROUTE_AWS_PROVIDER_COMMIT:-}" ]; then
    echo "build-aws-provider: set GPUROUTE_AWS_PROVIDER_COMMIT to the commit of tag v$VERSION of $MODULE" >&2
    echo "  (git ls-remote https://github.com/hashicorp/terraform-provider-aws refs/tags/v$VERSION)" >&2
    exit 1
fi
command -v go >/dev/null 2>&1 || { echo "build-aws-provider: Go not found" >&2; exit 1; }
# the commit's pseudo-version (v1.60.1-0.<date>-<commit>), which go-build-module.sh builds
pseudo="$(cd "$(mktemp -d)" && GOFLAGS=-mod=mod go list -m -f '{{.Version}}' "$MODULE@$GPUROUTE_AWS_PROVIDER_COMMIT")"
built="$("$(dirname "$0")/go-build-module.sh" "$MODULE" "${pseudo#v}" . terraform-provider-aws \
    "most of an hour" | tail -n 1)"
mkdir -p "$(dirname "$BUILT/$BINARY")"
cp "$built" "$BUILT/$BINARY.tmp" && mv "$BUILT/$BINARY.tmp" "$BUILT/$BINARY"
echo "build-aws-provider: terraform-provider-aws $VERSION ($pseudo) in $BUILT" >&2
echo "$BUILT"
