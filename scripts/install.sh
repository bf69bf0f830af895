#!/usr/bin/env bash
# The one installer of tf_dlrm: used by `make`, CI and the Dockerfile, so all three get the same
# environment. Creates ./.venv (Python 3.11), installs pinned TensorFlow 2.18.1, builds Horovod
# 0.28.1 against it with Gloo (reusing a cached wheel), installs tf_dlrm in editable mode and
# compiles its CPU kernels (python -m tf_dlrm.ops.build; needs g++).
# Idempotent: when nothing it depends on changed, a second run only checks a stamp and exits.
#
# Environment:
#   TF_DLRM_VENV         where to create the virtual environment (default: ./.venv)
#   TF_DLRM_WHEEL_CACHE  where built Horovod wheels are kept (default: ~/.cache/tf_dlrm/wheels)
#   TF_DLRM_EXTRAS       pip extras of tf_dlrm to install, e.g. "test,spark" (default: "test")
#   TF_DLRM_FORCE_CPU=1  install tensorflow-cpu even when an NVIDIA GPU is visible
#   TF_DLRM_NO_SSHD=1    do not install openssh-server (see install_ssh below)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

venv="${TF_DLRM_VENV:-$here/.venv}"
wheel_cache="${TF_DLRM_WHEEL_CACHE:-${HOME:-/root}/.cache/tf_dlrm/wheels}"
extras="${TF_DLRM_EXTRAS:-test}"
tf_version="2.18.1"
horovod_version="0.28.1"

log() { printf '[install] %s\n' "$*" >&2; }

# tf_dlrm's C++ kernels (tf_dlrm/ops) keep their own stamp: rebuilt only when their sources or
# TensorFlow change, so this also runs when the environment itself is up to date.
# The Dockerfile runs this installer before it copies the code (so that code edits reuse the
# installed layer) and builds the kernels in a later step: without their sources, skip them.
build_kernels() {
  if [[ ! -f tf_dlrm/ops/build.py ]]; then
    log "tf_dlrm/ops is not here yet (the Dockerfile's install layer): kernels are built later"
    return 0
  fi
  "$venv/bin/python" -m tf_dlrm.ops.build
}

find_python() {
  local candidate
  for candidate in "${PYTHON:-}" python3.11 python3; do
    [[ -n "$candidate" ]] || continue
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  log "Python 3.11 is required (TensorFlow ${tf_version} and Horovod ${horovod_version} are pinned for it); none found on PATH."
  log "Install python3.11 or set PYTHON=/path/to/python3.11."
  return 1
}

# horovodrun reaches the ranks of other machines through ssh; tests/parallel/test_two_hosts.py
# launches two "hosts" on loopback addresses through an sshd of its own. The system's OpenSSH is
# installed where this installer may (root with apt-get); elsewhere that test is skipped, saying so.
# Outside the environment's stamp: it concerns the machine, not ./.venv.
install_ssh() {
  [[ "${TF_DLRM_NO_SSHD:-0}" != "1" ]] || return 0
  if command -v ssh >/dev/null 2>&1 && { command -v sshd >/dev/null 2>&1 || [[ -x /usr/sbin/sshd ]]; }; then
    return 0
  fi
  if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
    log "installing openssh-server (horovodrun's ssh to other hosts; the two-host test)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
             openssh-client openssh-server >/dev/null; }; then
      log "installing openssh-server failed: tests/parallel/test_two_hosts.py will be skipped"
    fi
  else
    log "no OpenSSH server here and no root apt-get to install it: tests/parallel/test_two_hosts.py will be skipped"
  fi
}
install_ssh

gpu_build=""
if [[ "${TF_DLRM_FORCE_CPU:-0}" != "1" ]] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  tf_requirement="tensorflow[and-cuda]==${tf_version}"
  # Horovod's GPU collectives need NCCL and a CUDA compiler; without nvcc it is built for CPU tensors only.
  command -v nvcc >/dev/null 2>&1 && gpu_build="-nccl"
else
  tf_requirement="tensorflow-cpu==${tf_version}"
fi

# The stamp records everything that decides the environment's contents; extras already
# installed by an earlier run (e.g. `make test` installs spark, `make demo` asks only for test) count.
stamp="$venv/.tf_dlrm_install_stamp"
files_key="$(cat scripts/install.sh setup.cfg pyproject.toml 2>/dev/null | sha256sum | cut -c1-16) ${tf_requirement}"
installed_extras=""
if [[ -f "$stamp" ]]; then
  read -r stamped_key installed_extras < "$stamp" || true
  stamped_key="${stamped_key//|/ }"
  if [[ "$stamped_key" == "$files_key" ]]; then
    missing=""
    for extra in ${extras//,/ }; do [[ ",$installed_extras," == *",$extra,"* ]] || missing=1; done
    if [[ -z "$missing" ]] && "$venv/bin/python" -c 'import horovod.tensorflow, tf_dlrm' 2>/dev/null; then
      log "environment in $venv is up to date (extras: $installed_extras)"
      build_kernels
      exit 0
    fi
    extras="$(printf '%s\n' ${extras//,/ } ${installed_extras//,/ } | sort -u | paste -sd, -)"
  fi
fi

python_bin="$(find_python)"
if [[ ! -x "$venv/bin/python" ]]; then
  log "creating $venv with $python_bin"
  "$python_bin" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install --quiet --upgrade "pip>=24" "setuptools>=69,<80" wheel

log "installing ${tf_requirement}"
"${pip[@]}" install --quiet "${tf_requirement}" "keras==3.8.0" "numpy<2.1" "pyyaml>=6" "absl-py>=2" "psutil>=5"

if ! "$venv/bin/python" -c 'import horovod.tensorflow' 2>/dev/null; then
  py_tag="$("$venv/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
  cache_dir="$wheel_cache/horovod-${horovod_version}-tf-${tf_version}-${py_tag}-$(uname -m)${gpu_build}"
  mkdir -p "$cache_dir"
  wheel="$(ls "$cache_dir"/horovod-"${horovod_version}"-*.whl 2>/dev/null | head -n1 || true)"
  if [[ -z "$wheel" ]]; then
    command -v cmake >/dev/null 2>&1 || "${pip[@]}" install --quiet "cmake<4"
    log "building horovod ${horovod_version} against TensorFlow ${tf_version} with Gloo (several minutes, once; cached in $cache_dir)"
    build_dir="$(mktemp -d)"
    gpu_env=()
    if [[ -n "$gpu_build" ]]; then
      # NCCL from the nvidia-nccl wheel that tensorflow[and-cuda] installed, when there is one.
      nccl_home="$("$venv/bin/python" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)"
      gpu_env=(HOROVOD_GPU_OPERATIONS=NCCL ${nccl_home:+HOROVOD_NCCL_HOME="$nccl_home"})
      log "building horovod with NCCL (GPU collectives)${nccl_home:+ from $nccl_home}"
    fi
    env "${gpu_env[@]}" \
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    MAKEFLAGS="-j$(nproc)" \
      "${pip[@]}" wheel --no-build-isolation --no-deps --no-cache-dir \
        "horovod==${horovod_version}" -w "$build_dir"
    # Publish the wheel with one rename so an interrupted build never leaves a broken cache entry.
    built="$(ls "$build_dir"/horovod-*.whl)"
    cp "$built" "$cache_dir/.partial.whl"
    mv "$cache_dir/.partial.whl" "$cache_dir/$(basename "$built")"
    rm -rf "$build_dir"
    wheel="$cache_dir/$(basename "$built")"
  else
    log "reusing cached $wheel"
  fi
  "${pip[@]}" install --quiet --no-deps "$wheel"
  # horovod's own runtime requirements (its wheel was installed without dependency resolution)
  "${pip[@]}" install --quiet cloudpickle psutil pyyaml packaging cffi
fi

log "installing tf_dlrm[${extras}] (editable)"
"${pip[@]}" install --quiet --no-build-isolation -e ".[${extras}]"

"$venv/bin/python" -c 'import tensorflow as tf, horovod.tensorflow as hvd; print("[install] tensorflow", tf.__version__, "horovod ok, gloo built:", hvd.gloo_built())' >&2
build_kernels
echo "${files_key// /|} ${extras}" > "$stamp"
log "done"
