# laoyao in a container (docs/container.md): built on the CUDA 13.0 development image with cuDNN 9.19
# and NCCL 2.28 pinned, run on the runtime image with the same libraries. Every step is one of
# scripts/container_steps.sh, which CI runs on its plain machine.
#   docker build -t laoyao .
#   docker run --gpus all --rm laoyao doctor
# The versions laoyao is built and checked with (../shared/device.md); apt takes the globs.
ARG CUDA_VERSION=13.0.0
ARG CUDNN_VERSION=9.19.0.*
ARG NCCL_VERSION=2.28.9-*

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
ARG CUDNN_VERSION
ARG NCCL_VERSION
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      libcudnn9-cuda-13=${CUDNN_VERSION} libcudnn9-dev-cuda-13=${CUDNN_VERSION} \
      libcudnn9-headers-cuda-13=${CUDNN_VERSION} libnccl2=${NCCL_VERSION} libnccl-dev=${NCCL_VERSION}
WORKDIR /src
COPY . .
RUN bash scripts/container_steps.sh build && bash scripts/container_steps.sh bundle build/default /opt/laoyao

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
ARG CUDNN_VERSION
ARG NCCL_VERSION
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      libcudnn9-cuda-13=${CUDNN_VERSION} libnccl2=${NCCL_VERSION} libgomp1 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/laoyao /opt/laoyao
COPY scripts/container_steps.sh /opt/laoyao-steps/scripts/container_steps.sh
ENV LD_LIBRARY_PATH=/opt/laoyao/lib PATH=/opt/laoyao:$PATH
# A real check of what was built: the CPU ops, the FP8 casts and the CUDA libraries it loads.
RUN laoyao doctor --no-gpu
ENTRYPOINT ["laoyao"]
