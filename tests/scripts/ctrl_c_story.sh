#!/usr/bin/env bash
# The Ctrl-C story, as a user lives it: a run against a real model endpoint (the project's
# OpenAI-compatible test server, in a process of its own) is interrupted with Ctrl-C, the command
# trajkit prints to finish it is run exactly as printed, and every trajectory comes from that
# model, with the run's distribution, executor and --max_samples.
#
#   tests/scripts/ctrl_c_story.sh WORK_DIR
#
# `trajkit` and `python` are the ones on PATH. Exits non-zero, saying why, if any step fails.
set -euo pipefail

work=$(realpath "$1")
mkdir -p "$work"
cd "$work"
fail() { echo "FAILED: $*" >&2; exit 1; }

for i in $(seq 0 29); do echo "{\"prompt\": \"Task $i: list the files and describe them\"}"; done > slow.jsonl

python -m trajkit.testing.openai_server --port 0 --latency 0.3 --model story-model \
    --policy trajkit.testing.policies:dialect_policy > server.out 2> server.err &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 300); do grep -q READY server.out && break; sleep 0.1; done
url=$(awk '/^READY/ {print $2}' server.out)
[ -n "$url" ] || fail "the test server did not start: $(cat server.err)"

# 1. The run, interrupted once a few trajectories are in its ledger.
trajkit run --dataset_file slow.jsonl --run_name slow --output_dir data --model story-model \
    --base_url "$url" --distribution file_only --executor local --max_samples 20 \
    --num_workers 3 --quiet 2> first.err &
run=$!
for _ in $(seq 600); do
    [ "$(cat data/slow/batch_*.jsonl 2>/dev/null | wc -l)" -ge 4 ] && break
    sleep 0.1
done
kill -INT $run
status=0; wait $run || status=$?
[ "$status" -eq 130 ] || fail "the interrupted run exited $status, not 130: $(cat first.err)"

# 2. What trajkit says to do next, run exactly as printed.
printed=$(sed -n 's/^to finish[^:]*: //p' first.err)
[ -n "$printed" ] || fail "no 'to finish' command was printed: $(cat first.err)"
echo "printed: $printed"
status=0; eval "$printed" 2> second.err || status=$?
[ "$status" -eq 0 ] || fail "the printed command exited $status: $(cat second.err)"

# 3. Every trajectory is the real model's, with the run's own settings.
python - <<'PY'
import json, sys
records = [json.loads(line) for line in open("data/slow/trajectories.jsonl")]
problems = []
if len(records) != 20:
    problems.append(f"{len(records)} trajectories, not the 20 of --max_samples 20")
models = {r["metadata"]["model"] for r in records}
if models != {"story-model"}:
    problems.append(f"trajectories from {sorted(models)}, not only story-model")
offered = {tuple(r["toolsets_offered"]) for r in records}
if offered != {("file",)}:
    problems.append(f"toolsets offered {sorted(offered)}, not the file_only distribution's")
manifest = json.load(open("data/slow/run.json"))
invocations = manifest["invocations"]
if len(invocations) != 2 or any(not (i.get("model_client") or {}).get("requests") for i in invocations):
    problems.append(f"not two invocations that both asked the model: {invocations}")
if manifest["config"].get("executor") != "local" or not manifest["config"].get("base_url"):
    problems.append("the run's settings are not the ones it was started with")
if problems:
    sys.exit("FAILED: " + "; ".join(problems))
print(f"OK: {len(records)} trajectories, all from story-model, in {len(invocations)} invocations")
PY
