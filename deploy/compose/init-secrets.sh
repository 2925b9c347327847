#!/usr/bin/env bash
# compose.yaml's one-shot `secrets` service: the broker users and the gateway's tokens file
# (docs/deploy/compose.md). Runs before RabbitMQ and the vmsched services,
# on every `docker compose up`; what exists is kept, so passwords and tokens survive re-runs.
#
#   $SECRETS/broker/            password file of each broker user (root only; setup-users.sh)
#   $SECRETS/rabbitmq/definitions.json
#                               users (salted hashes), permissions, topic permissions and exchanges,
#                               loaded by RabbitMQ at boot (load_definitions): no default guest user
#   $SECRETS/<component>/amqp.url
#                               the broker URL of that component's own user, one volume each,
#                               readable only by the services' uid
#   $SECRETS/gateway-tokens/tokens.yaml
#                               the gateway's hashed bearer tokens (created once, with one token)
#   $SECRETS/gateway-console/console.secret
#                               the secret that signs console sessions (created once; every gateway
#                               replica reads the same file)
#   $SECRETS/operator/          what the operator takes away: admin.token (the first token,
#                               all roles) and vmsched-agent-<host>.url for the hypervisors
#
# Environment: RABBITMQ_ADMIN_PASSWORD (the management UI's vmsched-admin user, from .env),
# VMSCHED_AGENT_HOSTS (host IDs of the hypervisor agents, space or comma separated),
# VMSCHED_BROKER_ADDRESS (HOST:PORT the hypervisors reach the broker at), SERVICE_UID (10001).
set -euo pipefail
umask 077

SECRETS="${SECRETS:-/secrets}"
HERE="$(cd "$(dirname "$0")" && pwd)"
SETUP_USERS="${SETUP_USERS:-$HERE/../rabbitmq/setup-users.sh}"
VMSCHED="${VMSCHED:-vmsched}"
SERVICE_UID="${SERVICE_UID:-10001}"
BROKER_IN_COMPOSE="rabbitmq:5672"

say() { echo "init-secrets: $*" >&2; }
owned() {  # chown to the services' user where we can (root in the container; a test may not be)
  chown "$SERVICE_UID:$SERVICE_UID" "$@" 2>/dev/null || [ "$(id -u)" != 0 ]
}

mkdir -p "$SECRETS/broker" "$SECRETS/rabbitmq" "$SECRETS/operator" "$SECRETS/gateway-tokens" "$SECRETS/gateway-console"
chmod 0700 "$SECRETS/broker" "$SECRETS/operator"
chmod 0755 "$SECRETS/rabbitmq"

# --- broker users --------------------------------------------------------------------------
admin_pw="${RABBITMQ_ADMIN_PASSWORD:-}"
[[ "$admin_pw" =~ ^[A-Za-z0-9._~-]{16,}$ ]] || {
  say "RABBITMQ_ADMIN_PASSWORD (in .env) must be at least 16 of A-Z a-z 0-9 . _ ~ - (e.g. openssl rand -hex 24)"
  exit 2
}
printf '%s\n' "$admin_pw" > "$SECRETS/broker/vmsched-admin"

agent_hosts="${VMSCHED_AGENT_HOSTS:-}"
agent_hosts="${agent_hosts//,/ }"
agent_args=()
for host in $agent_hosts; do agent_args+=(--agent "$host"); done

bash "$SETUP_USERS" --secrets "$SECRETS/broker" --vhost / --broker "$BROKER_IN_COMPOSE" \
  "${agent_args[@]}" --admin --print > "$SECRETS/rabbitmq/definitions.json.new"
chmod 0444 "$SECRETS/rabbitmq/definitions.json.new"   # hashes only; RabbitMQ's own user reads it
mv -f "$SECRETS/rabbitmq/definitions.json.new" "$SECRETS/rabbitmq/definitions.json"

for component in gateway discovery scoring balancer; do
  dir="$SECRETS/$component"
  mkdir -p "$dir"
  chmod 0755 "$dir"   # root's; the file below is the services' user's alone
  rm -f "$dir/amqp.url"
  cp "$SECRETS/broker/vmsched-$component.url" "$dir/amqp.url"
  chmod 0400 "$dir/amqp.url"
  owned "$dir/amqp.url"
done
rm -f "$SECRETS/broker/vmsched-admin.url"   # the admin logs into the UI, it needs no URL

# the hypervisors' agents reach the broker at the published address, not the compose name
for host in $agent_hosts; do
  [ -n "${VMSCHED_BROKER_ADDRESS:-}" ] || { say "VMSCHED_AGENT_HOSTS needs VMSCHED_BROKER_ADDRESS (HOST:PORT)"; exit 2; }
  sed "s|@$BROKER_IN_COMPOSE/|@$VMSCHED_BROKER_ADDRESS/|" "$SECRETS/broker/vmsched-agent-$host.url" \
    > "$SECRETS/operator/vmsched-agent-$host.url"
done

# --- the workers' runtime directory: their in-flight journals (docs/reliability.md, "Poison requests") ---
if [ -d "$SECRETS/worker-run" ]; then
  chmod 0700 "$SECRETS/worker-run"
  owned "$SECRETS/worker-run"
fi

# --- the gateway's tokens file ------------------------------------------------------------
tokens="$SECRETS/gateway-tokens/tokens.yaml"
if [ ! -e "$tokens" ]; then
  chmod 0755 "$SECRETS/gateway-tokens" 2>/dev/null || true
  "$VMSCHED" token new --name admin --role read --role schedule --role operate --file "$tokens" \
    > "$SECRETS/operator/admin.token"
  chmod 0400 "$SECRETS/operator/admin.token"
  chmod 0600 "$tokens"
  # the gateway reads it; `vmsched token new --file` run as the services' user rewrites it in place
  owned "$SECRETS/gateway-tokens" "$tokens"
  say "made the gateway's tokens file with the token 'admin' (all roles); read it with:"
  say "  docker compose run --rm --no-deps --entrypoint cat secrets /secrets/operator/admin.token"
fi
# --- the secret that signs console sessions (docs/console.md) ---------------------------------
console_secret="$SECRETS/gateway-console/console.secret"
if [ ! -e "$console_secret" ]; then
  chmod 0755 "$SECRETS/gateway-console" 2>/dev/null || true
  "$VMSCHED" console-secret --file "$console_secret"
  chmod 0400 "$console_secret"
  owned "$console_secret"   # the gateway's alone
fi
say "broker users, URL files, tokens file and console secret ready"
