#!/usr/bin/env bash
# The one installer of tf_dlrm: used by `make`, CI and the Dockerfile, so all three get the same
# environment. Creates ./.venv, installs pinned TensorFlow 2.21.0 and Keras 3.15.1, builds Horovod
# 0.28.1 against them with Gloo from its source archive (checked by hash, with one patch of ours:
# scripts/patches/; reusing a cached wheel), installs tf_dlrm in editable mode and compiles its
# CPU kernels (python -m tf_dlrm.ops.build; needs g++).
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
tf_version="2.21.0"
keras_version="3.15.1"
horovod_version="0.28.1"
# Horovod 0.28.1 is its last release and ships as a source archive only. Its TensorFlow library
# compiles one file, xla_mpi_ops.cc (collectives inside XLA clusters), against XLA headers that
# TensorFlow 2.19+ no longer ships whole; the patch leaves that file out of the build, which is
# all it changes. tf_dlrm never puts a collective inside a compiled function (--xla compiles the
# dense computation only), so nothing here uses those ops.
horovod_sdist_sha256="92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0"
horovod_patch="scripts/patches/horovod-${horovod_version}-without-xla-ops.patch"
horovod_patch_sha256="$(sha256sum "$horovod_patch" | cut -c1-64)"
# Pythons TensorFlow 2.21 and this Horovod were tested with here; the machine's python3 is
# preferred when it is one of them.
supported_pythons="3.11 3.12"

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
  local candidate version
  for candidate in "${PYTHON:-}" python3 $(printf 'python%s ' $supported_pythons); do
    [[ -n "$candidate" ]] || continue
    command -v "$candidate" >/dev/null 2>&1 || continue
    version="$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" || continue
    if [[ " $supported_pythons " == *" $version "* ]]; then
      command -v "$candidate"; return 0
    fi
  done
  log "Python ${supported_pythons// / or } is required (TensorFlow ${tf_version} and Horovod ${horovod_version} were tested with these); none found on PATH."
  log "Install one of them or set PYTHON=/path/to/python3.x."
  return 1
}

# Downloads Horovod's source archive, checks its hash, applies our patch (checked by hash too:
# the cache key names it) and builds a wheel into $1.
build_horovod_wheel() {
  local out="$1" work
  work="$(mktemp -d)"
  "${pip[@]}" download --quiet --no-deps --no-binary :all: "horovod==${horovod_version}" -d "$work"
  local archive="$work/horovod-${horovod_version}.tar.gz"
  if [[ "$(sha256sum "$archive" | cut -c1-64)" != "$horovod_sdist_sha256" ]]; then
    log "horovod-${horovod_version}.tar.gz does not have the expected sha256 ${horovod_sdist_sha256}: refusing to build it"
    return 1
  fi
  tar -xzf "$archive" -C "$work"
  if ! patch --quiet --forward -p1 -d "$work/horovod-${horovod_version}" < "$horovod_patch"; then
    log "$horovod_patch does not apply to horovod-${horovod_version}"
    return 1
  fi
  env "${gpu_env[@]}" \
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
  MAKEFLAGS="-j$(nproc)" \
    "${pip[@]}" wheel --no-build-isolation --no-deps --no-cache-dir "$work/horovod-${horovod_version}" -w "$out"
  rm -rf "$work"
}

# System packages for the tests of several machines, installed where this installer may (root with
# apt-get); elsewhere the tests that need them are skipped, saying so. Outside the environment's
# stamp: they concern the machine, not ./.venv.
# apt_install WHAT SKIPPED PACKAGE...: WHAT is logged, SKIPPED names the tests skipped without them.
apt_install() {
  local what="$1" skipped="$2"
  shift 2
  if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
    log "installing $* ($what)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
             "$@" >/dev/null; }; then
      log "installing $* failed: $skipped will be skipped"
    fi
  else
    log "no $* here and no root apt-get to install it: $skipped will be skipped"
  fi
}

# horovodrun reaches the ranks of other machines through ssh; tests/parallel/test_two_hosts.py
# launches two "hosts" on loopback addresses through an sshd of its own.
install_ssh() {
  [[ "${TF_DLRM_NO_SSHD:-0}" != "1" ]] || return 0
  if command -v ssh >/dev/null 2>&1 && { command -v sshd >/dev/null 2>&1 || [[ -x /usr/sbin/sshd ]]; }; then
    return 0
  fi
  apt_install "horovodrun's ssh to other hosts; the two-host test" tests/parallel/test_two_hosts.py \
    openssh-client openssh-server
}
install_ssh

# benchmarks/emulated_cluster.py makes network namespaces and shapes their links with ip and tc;
# tests/parallel/test_emulated_cluster.py runs four ranks on them.
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 ||
  apt_install "ip and tc for the emulated cluster" tests/parallel/test_emulated_cluster.py iproute2

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
files_key="$(cat scripts/install.sh "$horovod_patch" setup.cfg pyproject.toml 2>/dev/null | sha256sum | cut -c1-16) ${tf_requirement}"
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
"${pip[@]}" install --quiet "${tf_requirement}" "keras==${keras_version}" "numpy>=1.26" "pyyaml>=6" "absl-py>=2" "psutil>=5"

if ! "$venv/bin/python" -c 'import horovod.tensorflow' 2>/dev/null; then
  py_tag="$("$venv/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
  cache_dir="$wheel_cache/horovod-${horovod_version}-patch-${horovod_patch_sha256:0:12}-tf-${tf_version}-${py_tag}-$(uname -m)${gpu_build}"
  mkdir -p "$cache_dir"
  wheel="$(ls "$cache_dir"/horovod-"${horovod_version}"-*.whl 2>/dev/null | head -n1 || true)"
  if [[ -z "$wheel" ]]; then
    command -v cmake >/dev/null 2>&1 || "${pip[@]}" install --quiet "cmake<4"
    command -v patch >/dev/null 2>&1 || { log "the 'patch' program is needed to build horovod (apt-get install patch)"; exit 1; }
    log "building horovod ${horovod_version} (patched: $horovod_patch) against TensorFlow ${tf_version} with Gloo (several minutes, once; cached in $cache_dir)"
    build_dir="$(mktemp -d)"
    gpu_env=()
    if [[ -n "$gpu_build" ]]; then
      # NCCL from the nvidia-nccl wheel that tensorflow[and-cuda] installed, when there is one.
      nccl_home="$("$venv/bin/python" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)"
      gpu_env=(HOROVOD_GPU_OPERATIONS=NCCL ${nccl_home:+HOROVOD_NCCL_HOME="$nccl_home"})
      log "building horovod with NCCL (GPU collectives)${nccl_home:+ from $nccl_home}"
    fi
    build_horovod_wheel "$build_dir"
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
