# tf_dlrm: the same environment CI builds, via scripts/install.sh; the default command runs the demo.
#   docker build -t tf_dlrm .
#   docker run --rm tf_dlrm                 # make demo: synthetic data + horovodrun -np 2 + AUC
#   docker run --rm -v /data:/data tf_dlrm .venv/bin/horovodrun -np 2 -H localhost:2 --gloo \
#       .venv/bin/python main.py --dataset_path=/data/my_dataset
FROM python:3.11-slim-bookworm

# Compilers, CMake and patch build Horovod (from its source, with our patch) and tf_dlrm's kernels against TensorFlow; procps gives horovodrun `ps`;
# OpenSSH is how horovodrun starts the ranks of other machines (-H host1:N,host2:N; docs/training.md).
# Debian's versions are left to the pinned base image (pinning them breaks on every point release).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ make cmake patch procps openssh-client openssh-server iproute2 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/tf_dlrm
# Install first from the files that decide the environment, so code edits reuse this layer. The editable install
# maps the packages it finds at this step: both top-level packages must be there (for the console scripts).
COPY setup.cfg pyproject.toml README.md ./
COPY scripts/ scripts/
COPY tf_dlrm/__init__.py tf_dlrm/__init__.py
COPY preprocessing/__init__.py preprocessing/__init__.py
COPY main.py ./
RUN PYTHON=python3.11 bash scripts/install.sh

# tf_dlrm is installed in editable mode; of the rest of the code only its C++ kernels need building.
COPY . .
RUN .venv/bin/python -m tf_dlrm.ops.build

ENV TF_CPP_MIN_LOG_LEVEL=2 \
    PATH=/opt/tf_dlrm/.venv/bin:$PATH
CMD ["make", "demo"]
