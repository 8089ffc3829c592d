# The embodied runtime image: `rlark embodied` (robots, cameras, the kubelet device plugin,
# devinit) without ROS. Context: the repository root.
#
#   docker build -f deploy/docker/embodied.Dockerfile -t rlark-embodied:0.1.0 .
#   docker run --rm -v /run/rlark:/run/rlark rlark-embodied:0.1.0     # the simulated arm
#
# ROS robots (backend ros1/ros2) need a ROS installation in the image: build FROM a ROS base
# with --build-arg RUNTIME_BASE. The file and RTSP camera drivers decode through ffmpeg,
# which this image does not carry either. Runs as root: devinit enters other processes'
# network namespaces (docs/embodied.md); give it only NET_ADMIN, SYS_ADMIN and SYS_PTRACE.
#
# Without a registry (scripts/test_ops.sh): --target prebuilt with bin/ in the context and
# --build-arg RUNTIME_BASE=rlark-base-cc:bookworm (deploy/docker/make-base.sh).
ARG RUNTIME_BASE=gcr.io/distroless/cc-debian12
ARG RUST_IMAGE=rust:1.95-bookworm

FROM ${RUNTIME_BASE} AS prebuilt
COPY bin/rlark /usr/local/bin/rlark
COPY examples/embodied/sim.yaml /etc/rlark/embodied.yaml
ENTRYPOINT ["/usr/local/bin/rlark", "embodied", "--config", "/etc/rlark/embodied.yaml", "--socket-dir", "/run/rlark"]

FROM ${RUST_IMAGE} AS build
ARG SOURCE_DATE_EPOCH
ARG RLARK_GIT_COMMIT
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p rlark && mkdir /out && cp target/release/rlark /out/

FROM ${RUNTIME_BASE} AS runtime
COPY --from=build /out/rlark /usr/local/bin/rlark
COPY examples/embodied/sim.yaml /etc/rlark/embodied.yaml
ENTRYPOINT ["/usr/local/bin/rlark", "embodied", "--config", "/etc/rlark/embodied.yaml", "--socket-dir", "/run/rlark"]
