# The FlopWatch image: the node agent (`flopwatch agent`, the default command) and the fleet
# simulator (`flopwatch sim`, the compose `demo` profile). docker-compose.yml builds it.
#
# No NVIDIA library is baked in: on a GPU node the NVIDIA Container Toolkit mounts the driver's
# libnvidia-ml into the container when the service reserves GPUs, and the agent reads them through
# nvidia-ml-py. DCGM's Python bindings ship with DCGM itself, so this image uses NVML
# (backend auto); mount a DCGM install and set FLOPWATCH_BACKEND=dcgm to use a host engine.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility

WORKDIR /src
COPY pyproject.toml README.md ./
COPY flopwatch ./flopwatch
# the influx extra: the optional InfluxDB v2 sink (influx.url)
RUN pip install '.[influx]' && rm -rf /src

WORKDIR /
# the outage buffer of the InfluxDB sink; the compose file mounts a volume here
RUN mkdir -p /var/lib/flopwatch/influx
EXPOSE 9847
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
    CMD python -c "import urllib.request, sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:9847/healthz', timeout=4).status != 200)"
ENTRYPOINT ["flopwatch"]
CMD ["agent"]
