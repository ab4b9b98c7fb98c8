"""`flopwatch agent`: the config from file, environment and flags; the agent wired from it
(flopwatch/exporters/wiring.py) collecting on a clock and serving /metrics."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from flopwatch import config as cfg
from flopwatch.errors import RuntimeFailure, UsageError
from flopwatch.exporters.wiring import build_agent, web_access
from flopwatch.logs import setup_logging

log = logging.getLogger("flopwatch.agent")

#: flag -> config key; every flag is optional so the file and environment can set it instead.
FLAGS = {
    "backend": "backend", "listen": "listen", "web_config": "web_config", "interval": "interval", "node": "node",
    "log_level": "log_level", "peak_flops": "gpu.peak_flops", "sim_gpus": "sim.gpus",
    "sim_model": "sim.model", "nvlink_per_link": "gpu.nvlink_per_link", "sysfs_root": "nic.sysfs_root",
    "train": "collectors.train", "train_socket": "train.socket",
    "influx_url": "influx.url", "influx_org": "influx.org", "influx_bucket": "influx.bucket",
    "influx_token_file": "influx.token_file", "influx_buffer_dir": "influx.buffer_dir",
    "topology": "topology.slurm", "rails": "topology.rails",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML config file (keys as in docs/agent.md)")
    parser.add_argument("--backend", choices=["auto", "nvml", "dcgm", "sim"],
                        help="GPU backend (default auto: DCGM, then NVML)")
    parser.add_argument("--listen", metavar="HOST:PORT",
                        help=f"address to serve /metrics on (default 0.0.0.0:{cfg.DEFAULT_PORT})")
    parser.add_argument("--web-config", dest="web_config", metavar="FILE",
                        help="TLS, basic auth and bearer tokens for /metrics: a web config file in the "
                        "format Prometheus exporters use (docs/operations.md)")
    parser.add_argument("--interval", metavar="SECONDS", help="collection interval, 1 to 3600 (default 5)")
    parser.add_argument("--node", help="node label value (default: host name)")
    parser.add_argument("--log-level", dest="log_level", help="debug, info, warning or error")
    parser.add_argument("--peak-flops", dest="peak_flops", metavar="FLOPS",
                        help="dense peak FLOP/s per GPU, used for GPU models FlopWatch does not know")
    parser.add_argument("--sim-gpus", dest="sim_gpus", metavar="N", help="simulated GPUs (backend sim)")
    parser.add_argument("--sim-model", dest="sim_model", metavar="MODEL",
                        help="simulated GPU model, e.g. H100-SXM (backend sim)")
    parser.add_argument("--no-nvlink-per-link", dest="nvlink_per_link", action="store_const", const=False,
                        help="export NVLink counters summed per GPU instead of per link")
    parser.add_argument("--sysfs-root", dest="sysfs_root", metavar="PATH",
                        help="sysfs root for the NIC and host collectors (default /sys; a recorded tree "
                        "for tests)")
    parser.add_argument("--train", dest="train", action="store_const", const=True,
                        help="receive training-step events from flopwatch.train clients (collectors.train)")
    parser.add_argument("--train-socket", dest="train_socket", metavar="PATH",
                        help="Unix socket for training-step events (default /run/flopwatch/steps.sock)")
    parser.add_argument("--influx-url", dest="influx_url", metavar="URL",
                        help="also write every sample to this InfluxDB v2 write API, e.g. http://influxdb:8086 "
                        "(token from FLOPWATCH_INFLUX_TOKEN or --influx-token-file; docs/influxdb.md)")
    parser.add_argument("--influx-org", dest="influx_org", metavar="ORG", help="InfluxDB organization")
    parser.add_argument("--influx-bucket", dest="influx_bucket", metavar="BUCKET", help="InfluxDB bucket")
    parser.add_argument("--influx-token-file", dest="influx_token_file", metavar="FILE",
                        help="file holding the InfluxDB API token")
    parser.add_argument("--influx-buffer-dir", dest="influx_buffer_dir", metavar="DIR",
                        help="directory for the outage buffer (default /var/lib/flopwatch/influx)")
    parser.add_argument("--topology", metavar="FILE",
                        help="Slurm's topology.conf, to serve this node's switches (topology.slurm)")
    parser.add_argument("--rails", metavar="FILE",
                        help="rails YAML naming each NIC's leaf and each leaf's spines (topology.rails)")
    parser.add_argument("--once", action="store_true",
                        help="collect once, print the exposition to stdout and exit")
    parser.add_argument("--print-config", action="store_true", help="print the merged config and exit")


def load_config(args: argparse.Namespace) -> cfg.AgentConfig:
    overrides = {key: getattr(args, flag) for flag, key in FLAGS.items() if getattr(args, flag) is not None}
    try:
        return cfg.load(args.config, overrides)
    except cfg.ConfigError as error:
        raise UsageError(f"config error: {error}") from None


def run(args: argparse.Namespace) -> int:
    config = load_config(args)
    setup_logging(config.log_level)
    if args.print_config:
        for key, value in config.values.items():
            print(f"{key}: {value}")
        return 0
    access = web_access(config)
    agent = build_agent(config)
    try:
        agent.collect_once()
        if args.once:
            sys.stdout.buffer.write(agent.exposition())
            return 0
        host, port = config.listen
        try:
            host, port = agent.serve(host, port, access)
        except OSError as error:
            raise RuntimeFailure(f"cannot listen on {host}:{port}: {error.strerror}; "
                                 "pick another address with --listen HOST:PORT") from None
        scheme = "https" if access is not None and access.tls else "http"
        log.info("serving %s://%s:%d/metrics every %gs as node %s%s", scheme, host, port, config.interval,
                 config.node, " (authenticated)" if access is not None and access.config.authenticates else "")
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        collector_thread = threading.Thread(target=agent.run, args=(config.interval, stop),
                                            name="collect", daemon=True)
        collector_thread.start()
        while not stop.wait(1.0):
            pass
        log.info("stopping")
        collector_thread.join(timeout=config.interval + 5)
        return 0
    finally:
        if agent.http is not None:
            agent.http.stop()
        if access is not None:
            access.close()
        agent.close()
