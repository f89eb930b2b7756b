# Host CLI image: clean, lint, quantize, deploy / fleet validate / run / release over SSH, report.
# TensorRT is not in here: it lives on the target (JetPack), where edgeq's agent runs. The install
# step is the README's (tests/test_docker.py checks they do not drift). Run as a non-root user with
# the SSH keys, config and known_hosts mounted read-only:
#   docker run --rm -v "$PWD:/work" -v "$HOME/.ssh:/home/edgeq/.ssh:ro" edgeq deploy m.onnx --target t
FROM python:3.11-slim
RUN useradd --create-home --uid 1000 edgeq && mkdir /work && chown edgeq:edgeq /work
WORKDIR /opt/edgeq
COPY pyproject.toml README.md constraints.txt ./
COPY edgeq ./edgeq
RUN pip install --no-cache-dir -c constraints.txt . && rm -rf build
# Examples only (target files, fleets, pipelines): copy them into /work to use them.
COPY targets ./targets
COPY pipelines ./pipelines
USER edgeq
ENV XDG_CACHE_HOME=/home/edgeq/.cache
WORKDIR /work
ENTRYPOINT ["edgeq"]
CMD ["--help"]
