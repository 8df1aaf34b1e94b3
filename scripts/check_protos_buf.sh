#!/usr/bin/env bash
# Lints the protos with buf and checks them for breaking changes against the previous release.
#
# The previous release is the newest git tag v* reachable from HEAD; with no such tag, the
# descriptor image protos/buf-image.binpb (the contracts as last released). buf comes from the
# npm registry (`npx @bufbuild/buf`, pinned below); the first run downloads it (~6 s), later ones
# take ~2-3 s for both checks.
#
# Usage:
#   scripts/check_protos_buf.sh                    lint + breaking
#   scripts/check_protos_buf.sh --against REF      breaking against another buf input
#                                                  (e.g. '.git#tag=v0.2.0,subdir=protos' or an image)
#   scripts/check_protos_buf.sh --update-image     rewrite protos/buf-image.binpb from the current
#                                                  protos (at a release, after the checks pass)
set -euo pipefail
cd "$(dirname "$0")/.."

BUF_VERSION="${BUF_VERSION:-1.75.0}"
IMAGE=protos/buf-image.binpb
buf() { npx --yes "@bufbuild/buf@${BUF_VERSION}" "$@"; }

against=""
case "${1:-}" in
  --update-image)
    buf build --exclude-source-info -o "$IMAGE"
    echo "check_protos_buf: wrote $IMAGE"
    exit 0
    ;;
  --against)
    against="${2:?--against needs a buf input}"
    ;;
  "") ;;
  *)
    echo "check_protos_buf: unknown argument $1 (see the usage at the top of $0)" >&2
    exit 2
    ;;
esac

buf lint
echo "check_protos_buf: lint passed"

if [[ -z "$against" ]]; then
  tag="$(git describe --tags --abbrev=0 --match 'v*' 2>/dev/null || true)"
  if [[ -n "$tag" ]]; then
    against=".git#tag=${tag},subdir=protos"
  elif [[ -f "$IMAGE" ]]; then
    against="$IMAGE"
  else
    echo "check_protos_buf: no v* tag and no $IMAGE to compare with; run with --update-image at a release" >&2
    exit 2
  fi
fi
buf breaking --against "$against"
echo "check_protos_buf: no breaking changes against $against"
