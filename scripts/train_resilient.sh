#!/usr/bin/env bash
# Runs a training job under horovodrun on this machine and, when it loses a rank, runs it again from
# its newest intact checkpoint on the ranks that remain (one fewer each time), with a new sharding plan.
#
# Usage:
#   scripts/train_resilient.sh [--np N] [--min_np M] [--max_restarts R] [--horovodrun PATH] -- \
#       python main.py --save_checkpoint_path=DIR --checkpoint_every_steps=K [other main.py flags]
#
# - The first attempt runs the command as given; every later one adds --resume, so main.py continues
#   from the newest checkpoint under --save_checkpoint_path that verifies (a checkpoint half written
#   when the rank died is never published, a corrupt one is skipped and named).
# - main.py recomputes the plan for the new world size; checkpoints hold full tables, so any world
#   size restores them. --batch_size must divide by every world size tried.
# - No restart when the job failed for a reason a restart cannot fix: a rank's clean refusal of its
#   input or flags (exit status 2), or an interrupt (130, 143, or this script was signalled).
# - Single machine (localhost) only; several machines need horovodrun's own elastic mode.
# - The job runs under python -m tf_dlrm.cli.launch (horovodrun's arguments), in a process group of its own:
#   SIGTERM or SIGINT to this script (a scheduler's preemption, Ctrl-C) is passed on to it once, so every rank
#   saves a checkpoint and stops (exit 143 or 130), and the script exits with that status without a restart.
#   Also when the script was started with those signals ignored (a background command of a non-interactive shell,
#   `train_resilient.sh ... &` in a script, starts with SIGINT ignored), as the launch module treats them.
#
# Exit status: 0 when a run finished; otherwise the status of the last horovodrun.
set -uo pipefail

# Bash cannot trap a signal that was ignored when it started: a SIGINT to this script would pass by and the job train
# on to its end. Run again with SIGINT and SIGTERM at their defaults (coreutils env 8.31+).
if [[ -r /proc/$$/status ]] && (( 16#$(awk '/^SigIgn:/ {print $2}' /proc/$$/status) & 0x4002 )); then
  if env --default-signal=INT,TERM true 2>/dev/null; then
    exec env --default-signal=INT,TERM "$BASH" "$0" "$@"
  fi
  echo "train_resilient.sh: started with SIGINT or SIGTERM ignored, and this env cannot restore them: they will not reach the job" >&2
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
np=2
min_np=1
max_restarts=3
horovodrun="${HOROVODRUN:-}"  # empty: the launcher takes the one on PATH or beside its Python
[[ -x "$here/.venv/bin/horovodrun" && -z "$horovodrun" ]] && horovodrun="$here/.venv/bin/horovodrun"
python="${PYTHON:-}"

usage() { sed -n '2,23p' "$0" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --np) np="$2"; shift 2 ;;
    --min_np) min_np="$2"; shift 2 ;;
    --max_restarts) max_restarts="$2"; shift 2 ;;
    --horovodrun) horovodrun="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "train_resilient.sh: unknown option $1" >&2; usage ;;
  esac
done
[[ $# -gt 0 ]] || { echo "train_resilient.sh: give the training command after --" >&2; usage; }
# The launcher runs under PYTHON, else this checkout's .venv, else the training command's own Python.
if [[ -z "$python" ]]; then
  if [[ -x "$here/.venv/bin/python" ]]; then python="$here/.venv/bin/python"
  elif [[ "$(basename "$1")" == python* ]]; then python="$1"
  else python=python3
  fi
fi
for value in "$np" "$min_np" "$max_restarts"; do
  [[ "$value" =~ ^[0-9]+$ ]] || { echo "train_resilient.sh: expected whole numbers. Received: $value" >&2; exit 2; }
done
if ! printf '%s\n' "$@" | grep -q -- '^--save_checkpoint_path='; then
  echo "train_resilient.sh: the command needs --save_checkpoint_path=DIR (where a restart resumes from)" >&2
  exit 2
fi

# A background job gets a process group of its own: a signal meant for the job reaches its launcher once, from here.
set -m
interrupted=0
stop_status=0
trapped=0
launcher=""
# Bash runs a trap only between commands, so the job runs in the background and this script waits for it.
pass_on() {
  trapped=1
  if [[ $interrupted -eq 0 ]]; then
    interrupted=1
    stop_status=$2  # what the launcher exits with after a signal: 128 + its number
    [[ -n "$launcher" ]] && kill "-$1" "$launcher" 2>/dev/null
  fi
}
trap 'pass_on TERM 143' TERM
trap 'pass_on INT 130' INT
log="$(mktemp -t train_resilient.XXXXXX)"
trap 'rm -f "$log"' EXIT
# Should this script die without passing a signal on (SIGKILL, the out-of-memory killer), the launcher gets SIGTERM
# from the kernel and stops the job as after a preemption (checkpoint saved), instead of training on unattended.
pdeathsig=()
command -v setpriv >/dev/null 2>&1 && pdeathsig=(setpriv --pdeathsig TERM)

attempt=0
resume=()
while true; do
  echo "train_resilient.sh: attempt $((attempt + 1)) on $np rank(s)${resume:+ (--resume)}" >&2
  HOROVODRUN="$horovodrun" PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" \
    "${pdeathsig[@]}" "$python" -m tf_dlrm.cli.launch -np "$np" -H "localhost:$np" --gloo "$@" "${resume[@]}" 2>&1 | tee "$log" &
  last=$!
  launcher="$(jobs -p %%)"  # the pipeline's process group is led by the launcher
  [[ $interrupted -eq 1 ]] && kill -TERM "$launcher" 2>/dev/null  # signalled while it was starting
  # wait returns early when a signal's trap runs; the job goes on until it has saved and stopped.
  while true; do
    trapped=0
    wait "$last"
    status=$?
    [[ $trapped -eq 1 ]] || break
  done
  launcher=""
  [[ $interrupted -eq 1 ]] && status=$stop_status  # a wait cut short cannot tell the job's own status
  if [[ $status -eq 0 ]]; then
    exit 0
  fi
  # horovodrun names the first rank that failed and its exit code.
  first_code="$(grep -oE 'Exit code: -?[0-9]+' "$log" | head -n 1 | grep -oE -- '-?[0-9]+$')"
  if [[ $interrupted -eq 1 ]]; then
    echo "train_resilient.sh: stopped by a signal, passed on to the job (exit status $status); no restart" >&2
    exit "$status"
  fi
  if [[ "$first_code" == "2" || "$first_code" == "130" || "$first_code" == "143" ]]; then
    echo "train_resilient.sh: the job failed (rank exit code ${first_code:-unknown}); a restart would not help: stopping" >&2
    exit "$status"
  fi
  attempt=$((attempt + 1))
  if [[ $attempt -gt $max_restarts || $((np - 1)) -lt $min_np ]]; then
    echo "train_resilient.sh: lost a rank again (exit code ${first_code:-unknown}) and no restart is left: stopping" >&2
    exit "$status"
  fi
  np=$((np - 1))
  resume=(--resume)
  echo "train_resilient.sh: a rank was lost (exit code ${first_code:-unknown}); restarting from the newest intact checkpoint on $np rank(s)" >&2
done
