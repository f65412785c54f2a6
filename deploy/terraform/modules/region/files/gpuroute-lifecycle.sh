#!/bin/bash
# gpuroute-lifecycle: keeps the host's node agents (one per engine: AGENTS lists their
# indexes, each reading $AGENT_CONFIG_DIR/agent-<index>.toml under gpuroute-agent@<index>) in
# step with this host's Auto Scaling lifecycle state (IMDSv2
# autoscaling/target-lifecycle-state), polled every POLL_S seconds:
#   Warmed:Running  the host waits in the warm pool, engines loaded: every agent stands by
#   InService       the host serves in the group: every agent is active
#   Terminated      the host is leaving: every agent drains (all at once), then the
#                   terminating lifecycle hook (LIFECYCLE_HOOK) is completed with CONTINUE
#                   and the instance goes
# Each state is acted on once; an action that fails for any agent is tried again (for every
# agent) at the next poll. An agent keeps standby in memory: when one's unit restarts (a new
# systemd InvocationID), the watcher says Warmed:Running or InService again at its next poll.
# `--once` polls once and exits (tests). modules/region installs it as a systemd service.
set -uo pipefail

IMDS="${IMDS:-http://169.254.169.254}"
GPUROUTE="${GPUROUTE:-/opt/gpuroute/bin/gpuroute}"
AGENT_CONFIG_DIR="${AGENT_CONFIG_DIR:-/etc/gpuroute}"
AGENTS="${AGENTS:-0}"
STATE_FILE="${STATE_FILE:-/run/gpuroute-lifecycle/state}"
POLL_S="${POLL_S:-5}"
HOOK="${LIFECYCLE_HOOK:?LIFECYCLE_HOOK must name the terminating lifecycle hook}"

log() { echo "gpuroute-lifecycle: $*" >&2; }

imds() {
    local token
    token="$(curl -fsS -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' "$IMDS/latest/api/token")" &&
        curl -fsS -H "X-aws-ec2-metadata-token: $token" "$IMDS/latest/meta-data/$1"
}

agent() { "$GPUROUTE" agent "$1" --config "$AGENT_CONFIG_DIR/agent-$2.toml"; }

# every agent of the host; fails when any fails. drain: all at once (each waits for its
# engine's streams), so the host leaves within one drain timeout
agents() {
    local i failed=0 pids=()
    for i in $AGENTS; do
        if [ "$1" = drain ]; then
            agent "$1" "$i" &
            pids+=("$!")
        else
            agent "$1" "$i" || failed=1
        fi
    done
    for i in "${pids[@]}"; do wait "$i" || failed=1; done
    return "$failed"
}

# this run of each agent's unit (empty without systemd): a new one has forgotten standby
agent_run() {
    local i units=()
    for i in $AGENTS; do units+=("gpuroute-agent@$i"); done
    systemctl show --property InvocationID --value "${units[@]}" 2>/dev/null | tr '\n' ' '
}

complete_hook() {
    local region instance group
    region="$(imds placement/region)" && instance="$(imds instance-id)" || return 1
    # the group's name is on the instance as a tag (the role may already describe tags)
    group="$(aws ec2 describe-tags --region "$region" --output text --query 'Tags[0].Value' \
        --filters "Name=resource-id,Values=$instance" 'Name=key,Values=aws:autoscaling:groupName')" ||
        return 1
    aws autoscaling complete-lifecycle-action --region "$region" \
        --lifecycle-action-result CONTINUE --lifecycle-hook-name "$HOOK" \
        --auto-scaling-group-name "$group" --instance-id "$instance"
}

act() {
    case "$1" in
        Warmed:Running) agents standby ;;
        InService) agents activate ;;
        Terminated)
            # a failed drain still lets the host go: stopping an agent (SIGTERM) drains too
            agents drain || log "drain failed; an agent drains again when it is stopped"
            complete_hook
            ;;
        *) true ;; # Pending, Warmed:Pending, Detached, ...: nothing to do
    esac
}

step() {
    local state key last
    state="$(imds autoscaling/target-lifecycle-state)" || return 0 # not in a group (yet)
    key="$state"
    case "$state" in
        Warmed:Running | InService) key="$state $(agent_run)" ;;
    esac
    last="$(cat "$STATE_FILE" 2>/dev/null)"
    [ "$key" = "$last" ] && return 0
    log "${last:-boot} -> $key"
    if act "$state"; then
        echo "$key" >"$STATE_FILE"
    else
        log "$state: action failed, trying again"
    fi
}

mkdir -p "$(dirname "$STATE_FILE")"
if [ "${1:-}" = "--once" ]; then
    step
    exit 0
fi
while true; do
    step
    sleep "$POLL_S"
done
