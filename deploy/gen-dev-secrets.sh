#!/usr/bin/env bash
# Makes a development set of meshrl's secrets (never committed; deploy/.gitignore keeps them out):
#   auth-token         the bearer token every service requires
#   ca.crt, ca.key     a private CA (ca.key stays here: it is not mounted anywhere)
#   tls.crt, tls.key   one certificate for every service, signed by the CA, usable as server and as
#                      client certificate (mutual TLS); SANs: the Service names, "meshrl", localhost
#   redis-auth.conf    `requirepass ...` for the in-cluster / compose Redis
#   redis.env          MESHRL_REDIS__URL for the data buffer, with that password
#   registry.env       MESHRL_REGISTRY__REDIS_URL, the same Redis, for the rollout replicas in compose
#                      (Kubernetes hands them the URL from redis.env's Secret under that name)
# Kubernetes (deploy/k8s/base/kustomization.yaml) and compose (deploy/compose/docker-compose.yaml)
# both read them from deploy/k8s/base/secrets/. Production: put your own CA-issued files there.
#
# Usage: deploy/gen-dev-secrets.sh [--force] [OUT_DIR]
set -euo pipefail

force=0
if [[ "${1:-}" == "--force" ]]; then
  force=1
  shift
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/k8s/base/secrets}"
namespace="${MESHRL_NAMESPACE:-meshrl}"
days="${MESHRL_CERT_DAYS:-365}"

command -v openssl >/dev/null || { echo "gen-dev-secrets: openssl is needed (apt-get install openssl)" >&2; exit 2; }
mkdir -p "$out"
if [[ -e "$out/auth-token" && $force -eq 0 ]]; then
  echo "gen-dev-secrets: $out already holds secrets; pass --force to replace them" >&2
  exit 1
fi

umask 022
openssl rand -hex 32 >"$out/auth-token"

sans="DNS:meshrl,DNS:localhost,IP:127.0.0.1"
for svc in scheduler databuffer trainer rollout rollout-headless redis; do
  sans+=",DNS:meshrl-$svc,DNS:meshrl-$svc.$namespace,DNS:meshrl-$svc.$namespace.svc,DNS:meshrl-$svc.$namespace.svc.cluster.local"
done

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days "$days" \
  -subj "/CN=meshrl development CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=meshrl" \
  -keyout "$out/tls.key" -out "$tmp/tls.csr" 2>/dev/null
cat >"$tmp/ext.cnf" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$sans
EOF
openssl x509 -req -in "$tmp/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -days "$days" -extfile "$tmp/ext.cnf" -out "$out/tls.crt" 2>/dev/null
rm -f "$out/ca.srl"
chmod 600 "$out/ca.key"
# Compose bind-mounts these files into containers running as uid 10001: they must be readable there.
chmod 644 "$out/tls.key" "$out/auth-token"

password="$(openssl rand -hex 24)"
printf 'requirepass %s\n' "$password" >"$out/redis-auth.conf"
printf 'MESHRL_REDIS__URL=redis://:%s@meshrl-redis:6379/0\n' "$password" >"$out/redis.env"
printf 'MESHRL_REGISTRY__REDIS_URL=redis://:%s@meshrl-redis:6379/0\n' "$password" >"$out/registry.env"

echo "gen-dev-secrets: wrote auth-token, ca.crt, ca.key, tls.crt, tls.key, redis-auth.conf, redis.env, registry.env to $out"
