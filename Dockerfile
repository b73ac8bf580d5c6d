# ReVolta in a container. CPU image (default):
#   docker build -t revolta .
#   docker run --rm -p 8000:8000 revolta                      (the embedded demo model)
#   docker run --rm -p 8000:8000 -v /models:/models revolta --model /models/my-model
# CUDA image (the SM70+ kernels; run with --gpus all):
#   docker build --build-arg BASE=nvidia/cuda:12.8.1-devel-ubuntu24.04 --build-arg REVOLTA_CUDA=ON -t revolta:cuda .
#   docker run --rm --gpus all -p 8000:8000 revolta:cuda --device cuda
ARG BASE=debian:bookworm-slim
FROM ${BASE}

ARG REVOLTA_CUDA=OFF
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 REVOLTA_CACHE_DIR=/var/cache/revolta
RUN apt-get update && apt-get install -y --no-install-recommends g++ cmake ninja-build gdb ca-certificates \
        python3 python3-venv python3-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/revolta
ENV PATH=/opt/revolta/bin:$PATH

WORKDIR /src
COPY . .
RUN REVOLTA_CUDA=${REVOLTA_CUDA} pip install . && rm -rf /src/build
# The demo model is fetched and imported once, at build time, so a container starts serving at once.
RUN python -c "import revolta; revolta.demo_model()"

WORKDIR /
EXPOSE 8000
ENTRYPOINT ["revolta-server", "--host", "0.0.0.0", "--port", "8000"]
