#!/usr/bin/env bash
# Raw Criteo click logs in, a split_binary dataset (with its feature_spec.yaml) out, ready for main.py:
#
#   preprocessing/prepare_dataset.sh RAW_DIR OUTPUT_DIR [--flag=value ...]
#
# RAW_DIR holds either the Criteo 1TB days, day_0 .. day_23 (plain or .gz; any of them: days 0-22 are train, day 23's
# first half test and its second half validation), or the Kaggle train.txt (plain or .gz; the last 10% of rows test,
# the 10% before them validation). The days are read in day order. The frequency threshold is 3 (values seen fewer
# times in training share the rare id 1); flags after OUTPUT_DIR go to `python -m preprocessing.criteo` and win over
# these defaults, e.g. --frequency_threshold=10, --engine=spark --spark_master=URL, --keys=hashed, --split=none.
# PYTHON picks the interpreter: by default the checkout's .venv/bin/python when it exists, else python3.
set -euo pipefail

usage="usage: $0 RAW_DIR OUTPUT_DIR [--flag=value ...] (flags of python -m preprocessing.criteo)"
if [[ $# -lt 2 || $1 == -* || $2 == -* ]]; then
  echo "$usage" >&2
  exit 2
fi
raw_dir=$1
output_dir=$2
shift 2
if [[ ! -d $raw_dir ]]; then
  echo "$0: RAW_DIR is not a directory: $raw_dir" >&2
  exit 2
fi
raw_dir=$(cd "$raw_dir" && pwd)
output_dir=$(realpath -m "$output_dir")

# The checkout's root, so that `-m preprocessing.criteo` finds the package whatever the caller's directory.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-}
if [[ -z $python ]]; then
  if [[ -x $root/.venv/bin/python ]]; then python=$root/.venv/bin/python; else python=python3; fi
fi

# day_N sorted by N (a plain sort puts day_10 before day_2).
mapfile -t days < <(find "$raw_dir" -maxdepth 1 -type f -regextype posix-extended -regex '.*/day_[0-9]+(\.gz)?' \
  | awk -F/ '{ day = $NF; sub(/^day_/, "", day); sub(/\.gz$/, "", day); print day "\t" $0 }' | sort -n -k1,1 | cut -f2-)
if [[ ${#days[@]} -gt 0 ]]; then
  inputs=$(IFS=,; echo "${days[*]}")
  split=(--split=days)
elif [[ -f $raw_dir/train.txt || -f $raw_dir/train.txt.gz ]]; then
  inputs=$raw_dir/train.txt
  [[ -f $inputs ]] || inputs=$raw_dir/train.txt.gz
  split=(--split=fraction --test_fraction=0.1 --valid_fraction=0.1)
else
  echo "$0: expected day_0 .. day_23 (plain or .gz) or train.txt in RAW_DIR. Received: $raw_dir holds none of them" >&2
  exit 2
fi

# A default goes only where the caller's flags leave room for it: --split=none takes no fractions, and a
# vocabulary-free (--keys=hashed) or reused (--vocab_dir) vocabulary takes no threshold.
given() { local flag; for flag in "${@:2}"; do [[ $flag == --$1 || $flag == --$1=* ]] && return 0; done; return 1; }
defaults=()
given split "$@" || defaults+=("${split[@]}")
given frequency_threshold "$@" || given vocab_dir "$@" || given keys=hashed "$@" || defaults+=(--frequency_threshold=3)

cd "$root"
exec "$python" -m preprocessing.criteo --input="$inputs" --output_dir="$output_dir" "${defaults[@]}" "$@"
