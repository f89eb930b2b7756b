# Host CLI image: clean, lint, quantize, deploy over SSH, report. TensorRT is not in here: it lives
# on the target (JetPack), where edgeq's agent runs.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends openssh-client \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/edgeq
COPY pyproject.toml README.md ./
COPY edgeq ./edgeq
COPY targets ./targets
COPY pipelines ./pipelines
RUN pip install --no-cache-dir .
WORKDIR /work
ENTRYPOINT ["edgeq"]
CMD ["--help"]
