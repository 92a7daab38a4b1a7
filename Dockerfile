# The course in a Linux container: for macOS and Windows, where Triton has no wheels (README, "On a Mac or
# Windows"). Multi-architecture: the base image runs on x86-64 and arm64 (Apple silicon). Interpreter mode: the
# kernels run on the CPU through Triton's interpreter, timings come from the recorded H200 results.
#   docker build -t flashattn-course .
#   docker run --rm -it -p 127.0.0.1:8888:8888 flashattn-course            # JupyterLab: open the URL it prints
#   docker run --rm -it flashattn-course make test                         # every test and notebook
FROM python:3.11-slim-bookworm
# PyTorch's CPU-only build: the default one from PyPI carries several GB of CUDA libraries a container here cannot use
ENV TORCH_INDEX=https://download.pytorch.org/whl/cpu \
    LAB_IP=0.0.0.0
WORKDIR /course
COPY . .
RUN tools/container/setup.sh
EXPOSE 8888
CMD ["make", "lab"]
