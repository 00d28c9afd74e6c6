# llama-router on top of llama.cpp's CUDA server image, which provides /app/llama-server.
#
#   docker build -t llama-router .
#   docker run --gpus all -p 8080:8080 \
#     -v /srv/models:/models:ro -v /srv/llama-router:/configs:ro -v llama-router-state:/var/lib/llama-router \
#     llama-router
#
# /configs/config.toml is the router's config (model paths under /models); the request history lives in
# the /var/lib/llama-router volume. For ROCm, build FROM ghcr.io/ggml-org/llama.cpp:server-rocm instead.
ARG BASE=ghcr.io/ggml-org/llama.cpp:server-cuda
FROM ${BASE}

ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/llama-router
COPY pyproject.toml README.md ./
COPY router ./router
COPY statemachine ./statemachine
RUN python3 -m venv /opt/llama-router/venv \
    && /opt/llama-router/venv/bin/pip install --no-cache-dir . \
    && useradd --system --uid 10001 --home-dir /var/lib/llama-router --shell /usr/sbin/nologin router \
    && mkdir -p /var/lib/llama-router /models /configs \
    && chown router /var/lib/llama-router

ENV PATH=/opt/llama-router/venv/bin:/app:$PATH \
    ROUTER_CONFIG_PATH=/configs/config.toml \
    ROUTER_HOST=0.0.0.0 \
    ROUTER_PORT=8080 \
    HISTORY_DB_PATH=/var/lib/llama-router/history.db \
    XDG_STATE_HOME=/var/lib/llama-router

USER router
VOLUME ["/models", "/configs", "/var/lib/llama-router"]
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('ROUTER_PORT', '8080') + '/health', timeout=4)"]
ENTRYPOINT ["python3", "-m", "router"]
