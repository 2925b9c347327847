#!/usr/bin/env bash
# Least-privilege RabbitMQ users of vmsched (docs/deploy/broker-users.md).
#
#   deploy/rabbitmq/setup-users.sh --secrets DIR [--vhost VHOST] [--broker HOST:PORT] [--tls]
#                                  [--agent HOST_ID]... [--shared-agent] [--admin] [--delete-guest] [--print]
#
# One user per component, each limited to its own queues and exchanges:
#   vmsched-gateway          declares the exchanges; the only one that may publish requests
#                            (vmsched.requests, vmsched.agent); reads its own reply queues
#   vmsched-discovery/-scoring/-balancer
#                            consume their own request queues and their dead letters (vmsched.dead),
#                            reply on vmsched.reply
#   vmsched-agent-<HOST_ID>  (one per --agent) consumes vmsched.agent.<HOST_ID> only, may bind only
#                            its host's key, replies on vmsched.reply, publishes agent.<HOST_ID>.* events
#                            (its host facts among them) and reads facts snapshot requests (vmsched.facts)
#   vmsched-agent            (--shared-agent, e.g. a Kubernetes DaemonSet with one Secret) any
#                            agent queue: weaker, an agent could read another host's requests
#   vmsched-admin            (--admin) administrator of the management UI, all rights on the vhost
# Nobody of vmsched may write to the default exchange (amq.default), so nobody can publish to a queue
# by its name.
#
# Passwords are never on a command line: each is read from DIR/<user> (created with a random
# one, mode 0600, when missing). Users, permissions and exchanges are imported as a definitions
# document on rabbitmqctl's standard input, with salted SHA-256 password hashes. With --broker,
# DIR/<user>.url gets the user's full broker URL, for --amqp-url-file / VMSCHED_AMQP_URL_FILE.
# Run it again after changing a password file: the users are updated in place.
# --print writes the definitions to stdout instead of importing them (they hold hashes only).
# RABBITMQCTL overrides the rabbitmqctl command (e.g. "rabbitmqctl -n rabbit@broker").
set -euo pipefail
umask 077

secrets="" vhost="/" broker="" scheme="amqp" shared_agent=0 admin=0 delete_guest=0 print=0
agents=()
while [ $# -gt 0 ]; do
  case "$1" in
    --secrets) secrets="$2"; shift 2 ;;
    --vhost) vhost="$2"; shift 2 ;;
    --broker) broker="$2"; shift 2 ;;
    --tls) scheme="amqps"; shift ;;
    --agent) agents+=("$2"); shift 2 ;;
    --shared-agent) shared_agent=1; shift ;;
    --admin) admin=1; shift ;;
    --delete-guest) delete_guest=1; shift ;;
    --print) print=1; shift ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "setup-users.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$secrets" ] || { echo "setup-users.sh: --secrets DIR is required (one password file per user)" >&2; exit 2; }
mkdir -p "$secrets"
read -r -a ctl <<< "${RABBITMQCTL:-rabbitmqctl}"

name_ok() { [[ "$1" =~ ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$ ]]; }
re() { printf '%s' "$1" | sed 's/[.[\*^$()+?{|\\]/\\&/g'; }   # a literal inside a regex
json_re() { printf '%s' "$1" | sed 's/\\/\\\\/g'; }           # a regex inside a JSON string
[[ "$vhost" =~ ^[A-Za-z0-9/._-]+$ ]] || { echo "setup-users.sh: vhost '$vhost' has unsupported characters" >&2; exit 2; }

password() {  # the password of user $1: its file, created when missing
  local file="$secrets/$1"
  if [ ! -s "$file" ]; then
    od -An -N24 -tx1 /dev/urandom | tr -d ' \n' > "$file"
  fi
  local pw
  pw="$(head -n1 "$file")"
  [[ "$pw" =~ ^[A-Za-z0-9._~-]{16,}$ ]] || {
    echo "setup-users.sh: $file: use at least 16 of A-Z a-z 0-9 . _ ~ - (it goes into a URL)" >&2; exit 2; }
  printf '%s' "$pw"
}

hash_of() {  # RabbitMQ's rabbit_password_hashing_sha256: base64(salt + sha256(salt + password))
  local tmp; tmp="$(mktemp -d)"
  head -c4 /dev/urandom > "$tmp/salt"
  password "$1" > "$tmp/pw"
  cat "$tmp/salt" "$tmp/pw" | openssl dgst -sha256 -binary > "$tmp/digest"
  cat "$tmp/salt" "$tmp/digest" | base64 | tr -d '\n'
  rm -rf "$tmp"
}

users=() perms=() topics=()
add() {  # user configure write read [tags]
  users+=("{\"name\":\"$1\",\"password_hash\":\"$(hash_of "$1")\",\"hashing_algorithm\":\"rabbit_password_hashing_sha256\",\"tags\":\"${5:-}\"}")
  perms+=("{\"user\":\"$1\",\"vhost\":\"$vhost\",\"configure\":\"$(json_re "$2")\",\"write\":\"$(json_re "$3")\",\"read\":\"$(json_re "$4")\"}")
  if [ -n "$broker" ]; then
    local v; v="$(printf '%s' "$vhost" | sed 's|/|%2F|g')"
    printf '%s://%s:%s@%s/%s\n' "$scheme" "$1" "$(password "$1")" "$broker" "$v" > "$secrets/$1.url"
  fi
}
topic() {  # user exchange write read (explicit for every vmsched topic exchange: none means "any key")
  topics+=("{\"user\":\"$1\",\"vhost\":\"$vhost\",\"exchange\":\"$2\",\"write\":\"$(json_re "$3")\",\"read\":\"$(json_re "$4")\"}")
}

# request queues: vmsched.<op>.v2 (quorum, delivery limit)
SERVICE_QUEUES='vmsched\.(discover|filter|score|balance)\.v2'
# poison messages: a request past its delivery limit goes to the vmsched.dead exchange (whoever declares
# a request queue needs write on it, and read on the queue), and from there to its service's
# vmsched.<op>.v2.dlq queue
# gateway: creates the exchanges and the scheduling queues (so requests wait for a starting service),
# publishes requests, consumes its own exclusive reply queues vmsched.reply.<uuid>
# host facts (docs/facts.md): the gateway, scoring and balancer each bind their own exclusive queue
# vmsched.facts.<name>.<random> to vmsched.events with the key agent.*.facts, and ask the agents for a
# snapshot on the vmsched.facts exchange (key snapshot); each agent consumes vmsched.facts.snapshot.<host>
FACTS_BINDING='agent\.\*\.facts'
# decision log (docs/console.md): nothing is published per decision; a gateway asked for decisions asks the
# other replicas on vmsched.events (key gateway.decisions.query), they answer under gateway.decisions.answer.<token>
# of the asker, and every replica says who it is under gateway.decisions.presence; each binds these keys (the
# answer key its own token only) to its own exclusive queue vmsched.decisions.gateway.<token>
DECISIONS_QUEUE='vmsched\.decisions\.gateway\.[0-9a-f]{12}'
DECISIONS_KEYS='gateway\.decisions\.(query|presence|answer\.[0-9a-f]{12})'
# console logouts (docs/console.md): a replica shares the sessions logged out on it under gateway.console.logout,
# and asks for the others' list under gateway.console.hello; each binds both to its own exclusive queue
# vmsched.console.gateway.<token>
CONSOLE_QUEUE='vmsched\.console\.gateway\.[0-9a-f]{12}'
CONSOLE_KEYS='gateway\.console\.(logout|hello)'
# shadow comparisons (docs/testing-policies.md): scoring and balancer, run with --shadow, publish each under
# shadow.<service>; every gateway binds shadow.* to its own exclusive queue vmsched.shadow.gateway.<token>
SHADOW_QUEUE='vmsched\.shadow\.gateway\.[0-9a-f]{12}'
SHADOW_BINDING='shadow\.\*'
GATEWAY_QUEUES="$DECISIONS_QUEUE|$CONSOLE_QUEUE|$SHADOW_QUEUE"
add vmsched-gateway \
  "^(vmsched\.(requests|agent|reply|events|facts|dead)|$SERVICE_QUEUES|vmsched\.reply\..+|vmsched\.facts\.gateway\..+|$GATEWAY_QUEUES)\$" \
  "^(vmsched\.(requests|agent|facts|dead|events)|$SERVICE_QUEUES|vmsched\.reply\..+|vmsched\.facts\.gateway\..+|$GATEWAY_QUEUES)\$" \
  "^(vmsched\.(requests|reply|events)|$SERVICE_QUEUES|vmsched\.reply\..+|vmsched\.facts\.gateway\..+|$GATEWAY_QUEUES)\$"
topic vmsched-gateway vmsched.requests "^$SERVICE_QUEUES\$" "^$SERVICE_QUEUES\$"
topic vmsched-gateway vmsched.agent '.*' '^$'
topic vmsched-gateway vmsched.events "^($DECISIONS_KEYS|$CONSOLE_KEYS)\$" "^($FACTS_BINDING|$DECISIONS_KEYS|$CONSOLE_KEYS|$SHADOW_BINDING)\$"
topic vmsched-gateway vmsched.facts '^snapshot$' '^$'

service() {  # name op-regex [facts]
  local q="$2\.v2" dead="$2\.v2\.dlq"  # its request queues; their dead letters (bound to vmsched.dead)
  if [ "${3:-}" = facts ]; then
    local own="vmsched\.facts\.$1\..+"
    # and, with --shadow, its comparisons on vmsched.events under shadow.<name>
    add "vmsched-$1" "^($q|$dead|$own)\$" \
        "^($q|$dead|vmsched\.reply|vmsched\.dead|vmsched\.facts|vmsched\.events|$own)\$" \
        "^($q|$dead|vmsched\.requests|vmsched\.dead|vmsched\.events|$own)\$"
    topic "vmsched-$1" vmsched.events "^shadow\.$1\$" "^$FACTS_BINDING\$"
    topic "vmsched-$1" vmsched.facts '^snapshot$' '^$'
  else
    add "vmsched-$1" "^($q|$dead)\$" "^($q|$dead|vmsched\.reply|vmsched\.dead)\$" "^($q|$dead|vmsched\.requests|vmsched\.dead)\$"
    topic "vmsched-$1" vmsched.events '^$' '^$'
    topic "vmsched-$1" vmsched.facts '^$' '^$'
  fi
  topic "vmsched-$1" vmsched.requests '^$' "^$q\$"
  topic "vmsched-$1" vmsched.agent '^$' '^$'
}
service discovery 'vmsched\.discover'
service scoring 'vmsched\.(filter|score)' facts
service balancer 'vmsched\.balance' facts

agent() {  # user host-regex
  add "$1" "^(vmsched\.agent\.$2|vmsched\.facts\.snapshot\.$2)\$" \
      "^(vmsched\.agent\.$2|vmsched\.reply|vmsched\.events|vmsched\.facts\.snapshot\.$2)\$" \
      "^(vmsched\.agent\.$2|vmsched\.agent|vmsched\.facts|vmsched\.facts\.snapshot\.$2)\$"
  topic "$1" vmsched.agent '^$' "^$2\$"
  topic "$1" vmsched.facts '^$' '^snapshot$'
  topic "$1" vmsched.events "^agent\.$2\.[^.]+\$" '^$'
  topic "$1" vmsched.requests '^$' '^$'
}
for host in "${agents[@]}"; do
  name_ok "$host" || { echo "setup-users.sh: host ID '$host' is not usable (letters, digits, . _ : -)" >&2; exit 2; }
  agent "vmsched-agent-$host" "$(re "$host")"
done
if [ "$shared_agent" = 1 ]; then agent vmsched-agent '[^*#]+'; fi
if [ "$admin" = 1 ]; then add vmsched-admin '.*' '.*' '.*' administrator; fi

exchanges=()
for x in requests:topic agent:topic reply:direct events:topic facts:topic dead:direct; do
  exchanges+=("{\"name\":\"vmsched.${x%%:*}\",\"vhost\":\"$vhost\",\"type\":\"${x##*:}\",\"durable\":true,\"auto_delete\":false,\"internal\":false,\"arguments\":{}}")
done

join() { local IFS=,; printf '%s' "$*"; }
definitions="{\"vhosts\":[{\"name\":\"$vhost\"}],\"users\":[$(join "${users[@]}")],\"permissions\":[$(join "${perms[@]}")],\"topic_permissions\":[$(join "${topics[@]}")],\"exchanges\":[$(join "${exchanges[@]}")]}"

if [ "$print" = 1 ]; then
  printf '%s\n' "$definitions"
  exit 0
fi
printf '%s' "$definitions" | "${ctl[@]}" import_definitions --format json
if [ "$delete_guest" = 1 ]; then
  "${ctl[@]}" delete_user guest || true
fi
echo "setup-users.sh: users, permissions and exchanges set on vhost '$vhost'; passwords in $secrets/" >&2
