#!/usr/bin/env bash
# scripts/test-clients.sh: the agents as they really run. Installs the pinned Claude Code
# and Codex from npm (into a private prefix), starts a scripted model server on 127.0.0.1
# (scripts/clients-model.py: the Anthropic Messages API and the OpenAI Responses API,
# streamed, answering a fixed sequence of tool calls per scenario), mounts a volume, runs
# `coherent install claude-code` and `coherent install codex`, and drives `claude -p` and
# `codex exec` under `coherent run`: the hooks fire, the giver's writes are denied with
# coherent's text in the tool result the model receives, a refusal the hook could not see
# is explained, the MCP tools answer as the right session, bob's handoff is in his context,
# a headless end keeps the files and a compaction relays them.
#
# Prints a table (step, expected, observed) and exits non-zero on any failure.
#
# Needs: node and npm (Debian's nodejs/npm; Claude Code's package runs on Node 20 though it
# asks for 22), python3, fusermount3, the npm registry. Run as root (the mount; Claude Code
# as root wants IS_SANDBOX=1 for --dangerously-skip-permissions).
#
#   COHERENT_BIN_DIR=DIR      coherent and coherent-mount from DIR (default: target/debug,
#                             built when missing)
#   COHERENT_CLIENTS_DIR=DIR  where the clients are installed (default: target/clients)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLAUDE_VERSION=2.1.332
CODEX_VERSION=0.169.0
CLIENTS=${COHERENT_CLIENTS_DIR:-$ROOT/target/clients}
BIN=${COHERENT_BIN_DIR:-$ROOT/target/debug}
T0=$(date +%s)

say() { printf 'test-clients: %s\n' "$*" >&2; }

if [[ ! -x $BIN/coherent || ! -x $BIN/coherent-mount ]]; then
    say "building coherent and coherent-mount"
    (cd "$ROOT" && cargo build --quiet --bin coherent --bin coherent-mount)
fi
for tool in node npm python3 fusermount3; do
    command -v "$tool" >/dev/null || {
        say "$tool is missing: bash scripts/deps.sh installs it"
        exit 2
    }
done

# ---- the clients, pinned ------------------------------------------------------------------
installed_version() { # PACKAGE
    node -e 'try{console.log(require(process.argv[1]).version)}catch(e){}' \
        "$CLIENTS/node_modules/$1/package.json" 2>/dev/null || true
}
if [[ $(installed_version @anthropic-ai/claude-code) != "$CLAUDE_VERSION" ||
    $(installed_version @openai/codex) != "$CODEX_VERSION" ]]; then
    say "installing @anthropic-ai/claude-code@$CLAUDE_VERSION and @openai/codex@$CODEX_VERSION into $CLIENTS"
    mkdir -p "$CLIENTS"
    npm install --prefix "$CLIENTS" --no-audit --no-fund --loglevel=error \
        "@anthropic-ai/claude-code@$CLAUDE_VERSION" "@openai/codex@$CODEX_VERSION" >&2
fi
CLAUDE=$CLIENTS/node_modules/.bin/claude
CODEX=$CLIENTS/node_modules/.bin/codex
[[ $("$CLAUDE" --version) == "$CLAUDE_VERSION"* ]] || {
    say "claude --version: $("$CLAUDE" --version 2>&1)"
    exit 2
}
[[ $("$CODEX" --version) == *"$CODEX_VERSION" ]] || {
    say "codex --version: $("$CODEX" --version 2>&1)"
    exit 2
}

# ---- a volume, a home, the model server ---------------------------------------------------
mkdir -p "$ROOT/target"
WORK=$(mktemp -d "$ROOT/target/clients-test.XXXXXX")
BACKING=$WORK/backing MNT=$WORK/mnt STATE=$WORK/state
export HOME=$WORK/home CODEX_HOME=$WORK/home/.codex
mkdir -p "$BACKING" "$MNT" "$STATE" "$WORK/bin" "$HOME/.claude" "$CODEX_HOME"
# present before the sessions start: `coherent run` lets an agent write only what exists
echo '{}' >"$HOME/.claude.json"
ln -s "$BIN/coherent" "$WORK/bin/coherent"
ln -s "$BIN/coherent-mount" "$WORK/bin/coherent-mount"
ln -s "$CLAUDE" "$WORK/bin/claude"
ln -s "$CODEX" "$WORK/bin/codex"
export PATH=$WORK/bin:/usr/sbin:/usr/bin:/sbin:/bin
MOUNT_PID='' MODEL_PID=''
CGROUP2=$(awk -F' - ' '{ split($1, a, " "); split($2, b, " ");
                         if (b[1] == "cgroup2") { print a[5]; exit } }' /proc/self/mountinfo)

cleanup() {
    local rc=$?
    set +e
    cd /
    [[ -n $MODEL_PID ]] && kill "$MODEL_PID" 2>/dev/null && wait "$MODEL_PID" 2>/dev/null
    if [[ -n $MOUNT_PID ]] && kill -0 "$MOUNT_PID" 2>/dev/null; then
        kill -INT "$MOUNT_PID"
        for _ in $(seq 50); do
            kill -0 "$MOUNT_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$MOUNT_PID" 2>/dev/null
        wait "$MOUNT_PID" 2>/dev/null
    fi
    if awk -v m="$MNT" '$2 == m { f = 1 } END { exit !f }' /proc/mounts; then
        fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT"
    fi
    if ((rc != 0)); then
        say "kept $WORK for a look (model log: $WORK/model.log)"
    else
        rm -rf "$WORK"
    fi
    if [[ -n $CGROUP2 ]]; then
        for s in alice bob carol dave; do rmdir "$CGROUP2/coherent-session-$s" 2>/dev/null; done
    fi
    exit "$rc"
}
trap cleanup EXIT

coherent-mount "$BACKING" "$MNT" --state-dir "$STATE" 2>"$WORK/mount.log" &
MOUNT_PID=$!
for _ in $(seq 100); do
    [[ -e $MNT/.coherent/ctl ]] && break
    sleep 0.1
done
[[ -e $MNT/.coherent/ctl ]] || {
    say "the volume did not mount"
    exit 1
}
python3 "$ROOT/scripts/clients-model.py" "$WORK/port" "$WORK/model.log" &
MODEL_PID=$!
for _ in $(seq 100); do
    [[ -s $WORK/port ]] && break
    sleep 0.1
done
PORT=$(cat "$WORK/port")
export ANTHROPIC_BASE_URL=http://127.0.0.1:$PORT ANTHROPIC_API_KEY=scripted-key
export IS_SANDBOX=1 DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1
export SCRIPTED_API_KEY=scripted-key
cat >"$CODEX_HOME/config.toml" <<EOF
model = "gpt-5.3-codex"
model_provider = "scripted"

[model_providers.scripted]
name = "scripted"
base_url = "http://127.0.0.1:$PORT/v1"
wire_api = "responses"
env_key = "SCRIPTED_API_KEY"
EOF

# ---- the table ----------------------------------------------------------------------------
ROWS=() FAILED=0
row() { # STEP EXPECTED OK|FAIL OBSERVED
    ROWS+=("$1"$'\t'"$2"$'\t'"$3"$'\t'"$4")
    [[ $3 == ok ]] || FAILED=$((FAILED + 1))
}
# check STEP EXPECTED OBSERVED-TEXT NEEDLE...: ok when every needle is in the text
check() {
    local step=$1 expected=$2 text=$3 status=ok n
    shift 3
    for n in "$@"; do
        [[ $text == *"$n"* ]] || status=FAIL
    done
    local shown=${text//$'\n'/ }
    row "$step" "$expected" "$status" "${shown:0:150}"
}
# what the model server received at STEP of SCENARIO (the tool results and context since
# the model's last turn; FIELD `first` for the first request's whole prompt)
seen() { # SCENARIO STEP [FIELD]
    python3 - "$WORK/model.log" "$1" "$2" "${3:-last}" <<'EOF'
import json, sys
log, scen, step, field = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
out = ""
for line in open(log):
    e = json.loads(line)
    if e.get("scenario") == scen and e.get("step") == step:
        out = e.get(field) or ""
        if field == "first":
            out = out + "\n" + (e.get("all") or "") + "\n" + (e.get("last") or "")
        if field == "tools":
            out = " ".join(x for x in out if x)
print(out)
EOF
}
in_session() { # SESSION CMD...: in the session, from the mount
    local s=$1
    shift
    (cd "$MNT" && coherent run --session "$s" -- "$@")
}

cd "$MNT"
out=$(coherent install claude-code . 2>&1)
check "install claude-code" "hooks incl. PostToolUseFailure, MCP server" "$out" PostToolUseFailure "MCP server"
out=$(coherent install codex . 2>&1)
check "install codex" "hooks trusted through Codex itself" "$out" "trusted in Codex: the 7 coherent hooks"
out=$(coherent doctor . 2>&1 || true)
check "doctor" "codex hooks Trusted (asked of Codex)" "$(grep 'codex hooks trusted' <<<"$out")" "ok" "preToolUse Trusted" "sessionEnd Trusted"

in_session bob coherent register >/dev/null
in_session alice sh -c 'echo "plan v2" > plan.md'
in_session alice coherent transfer --to bob --note "review the plan" plan.md >/dev/null

# -- Claude Code: the giver ------------------------------------------------------------------
claude_p() { # SESSION PROMPT [ARGS...]
    local s=$1 p=$2
    shift 2
    in_session "$s" timeout 120 claude -p "$p" --dangerously-skip-permissions --output-format json "$@"
}
claude_p alice "SCENARIO:giver go" >"$WORK/claude-giver.json" 2>"$WORK/claude-giver.err" || true
check "claude SessionStart" "alice told what she handed on" "$(seen giver 0 first)" "Files you (session alice) handed on" "plan.md"
check "claude Write" "denied, deny text in the tool result" "$(seen giver 1)" "you handed plan.md to" "(bob)"
check "claude Bash" "denied, deny text in the tool result" "$(seen giver 2)" "this command would write plan.md" "you handed plan.md to"
check "claude refusal unseen by the hook" "PostToolUseFailure explains it" "$(seen giver 3)" "Permission denied" "PostToolUseFailure" "refused writing plan.md"
check "claude plan.md" "unchanged" "$(cat plan.md)" "plan v2"

# -- Claude Code: bob, the MCP tools ----------------------------------------------------------
claude_p bob "SCENARIO:mcp go" >"$WORK/claude-bob.json" 2>"$WORK/claude-bob.err" || true
check "claude bob's context" "plan.md from alice, with the note" "$(seen mcp 0 first)" "plan.md from alice" "review the plan"
check "claude MCP listed" "tool search loads the coherent tools" "$(seen mcp 1 tools)" "mcp__coherent__whoami" "mcp__coherent__inbox"
check "claude MCP whoami" "answers as bob" "$(seen mcp 2)" '"session":"bob"'
check "claude MCP inbox" "lists plan.md" "$(seen mcp 3)" '"path":"plan.md"' '"giver":"alice"'

# -- Claude Code: a headless end, then a compaction ------------------------------------------
claude_p carol "SCENARIO:worker go" >"$WORK/claude-carol.json" 2>"$WORK/claude-carol.err" || true
sid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["session_id"])' "$WORK/claude-carol.json" 2>/dev/null || true)
check "claude headless end" "SessionEnd (other): files kept, no relay" "$(cat work.md; coherent status work.md | head -1)" "work" "0 live"
check "claude headless rerun" "the same session writes its file again" "$(in_session carol sh -c 'echo again >> work.md && echo wrote' 2>&1)" "wrote"
claude_p carol "/compact" --resume "$sid" >"$WORK/claude-compact.json" 2>"$WORK/claude-compact.err" || true
check "claude PreCompact" "relays work.md to any session" "$(coherent status work.md)" "carol" "any session" "live: the giver is fenced"

# -- Codex -----------------------------------------------------------------------------------
in_session alice sh -c 'echo "more" >> plan.md' 2>/dev/null && row "codex setup" "plan.md still fenced" FAIL "alice could write" || true
codex_x() { # SESSION PROMPT
    in_session "$1" timeout 120 codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox "$2"
}
codex_x alice "SCENARIO:giver-codex go" >"$WORK/codex-giver.out" 2>"$WORK/codex-giver.err" || true
check "codex hooks run" "trusted hooks fire (no /hooks step)" "$(grep -x 'hook: [A-Za-z]*' "$WORK/codex-giver.err" | sort | uniq -c | tr '\n' ' ')" "2 hook: PreToolUse" "1 hook: SessionStart"
check "codex SessionStart" "alice told what she handed on" "$(seen giver-codex 0 first)" "Files you (session alice) handed on"
check "codex apply_patch" "denied, deny text in the tool output" "$(seen giver-codex 1)" "this patch would write plan.md" "you handed plan.md to"
check "codex shell" "denied, deny text in the tool output" "$(seen giver-codex 2)" "this command would write plan.md"
check "codex plan.md" "unchanged" "$(cat plan.md)" "plan v2"
codex_x bob "SCENARIO:mcp-codex go" >"$WORK/codex-bob.out" 2>"$WORK/codex-bob.err" || true
check "codex bob's context" "plan.md from alice" "$(seen mcp-codex 0 first)" "plan.md from alice"
check "codex MCP whoami" "answers as bob" "$(seen mcp-codex 1)" '"session":"bob"'
check "codex MCP inbox" "lists plan.md" "$(seen mcp-codex 2)" '"path":"plan.md"'
codex_x dave "SCENARIO:worker-codex go" >"$WORK/codex-dave.out" 2>"$WORK/codex-dave.err" || true
check "codex exec end" "no relay: the files stay with the session" "$(coherent status codex.md | head -1)" "codex.md: v1" "0 live"
check "codex headless rerun" "dave writes his file again" "$(in_session dave sh -c 'echo again >> codex.md && echo wrote' 2>&1)" "wrote"

# ---- the table ----------------------------------------------------------------------------
printf '\n%-34s  %-46s  %-4s  %s\n' STEP EXPECTED OK OBSERVED
for r in "${ROWS[@]}"; do
    IFS=$'\t' read -r a b c d <<<"$r"
    printf '%-34s  %-46s  %-4s  %s\n' "$a" "$b" "$c" "$d"
done
printf '\nclaude %s, codex %s: %d passed, %d failed (%ds)\n' "$CLAUDE_VERSION" "$CODEX_VERSION" \
    $((${#ROWS[@]} - FAILED)) "$FAILED" $(($(date +%s) - T0))
((FAILED == 0))
