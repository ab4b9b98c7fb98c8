"""Config precedence (defaults < file < environment < flags) and one-line errors naming the key."""

from __future__ import annotations

import pytest

from flopwatch import config as cfg


def test_defaults(tmp_path):
    config = cfg.load(environ={})
    assert config.listen == ("0.0.0.0", cfg.DEFAULT_PORT)
    assert cfg.DEFAULT_PORT not in (9100, 9400)
    assert config.interval == 5.0
    assert config.backend == "auto"
    assert config.gpu.dtype == "bf16"
    assert config.node  # host name


def test_precedence_file_env_flags(tmp_path):
    path = tmp_path / "agent.yml"
    path.write_text("interval: 10\nbackend: sim\ngpu:\n  timeout: 3\nsim:\n  gpus: 4\n")
    config = cfg.load(path, environ={})
    assert (config.interval, config.backend, config.gpu.timeout, config.sim.gpus) == (10, "sim", 3, 4)
    config = cfg.load(path, environ={"FLOPWATCH_INTERVAL": "2", "FLOPWATCH_SIM_GPUS": "2"})
    assert (config.interval, config.sim.gpus) == (2, 2)
    config = cfg.load(path, overrides={"interval": "1"}, environ={"FLOPWATCH_INTERVAL": "2"})
    assert config.interval == 1


@pytest.mark.parametrize(
    ("overrides", "environ", "names"),
    [
        ({"interval": "abc"}, {}, ["interval", "'abc'", "1 to 3600"]),
        ({"interval": 0.5}, {}, ["interval", "1 to 3600"]),
        ({}, {"FLOPWATCH_INTERVAL": "0"}, ["interval", "FLOPWATCH_INTERVAL"]),
        ({"listen": "nowhere"}, {}, ["listen", "HOST:PORT"]),
        ({"listen": "1.2.3.4:70000"}, {}, ["listen"]),
        ({"backend": "cuda"}, {}, ["backend", "auto, nvml, dcgm, sim"]),
        ({"sim.model": "Z9000"}, {}, ["sim.model", "H100-SXM"]),
        ({"sim.gpus": "2.5"}, {}, ["sim.gpus"]),
        ({"gpu.peak_flops": "-1"}, {}, ["gpu.peak_flops"]),
        ({}, {"FLOPWATCH_GPU_NVLINK_PER_LINK": "maybe"}, ["gpu.nvlink_per_link", "true or false"]),
    ],
)
def test_bad_values_name_the_key(overrides, environ, names):
    with pytest.raises(cfg.ConfigError) as caught:
        cfg.load(overrides=overrides, environ=environ)
    message = str(caught.value)
    assert "\n" not in message
    for name in names:
        assert name in message


def test_bad_files(tmp_path):
    unknown = tmp_path / "unknown.yml"
    unknown.write_text("intervall: 5\n")
    with pytest.raises(cfg.ConfigError, match="unknown key 'intervall'"):
        cfg.load(unknown, environ={})
    broken = tmp_path / "broken.yml"
    broken.write_text("interval: [5\n")
    with pytest.raises(cfg.ConfigError, match="not valid YAML at line"):
        cfg.load(broken, environ={})
    with pytest.raises(cfg.ConfigError, match="cannot read it"):
        cfg.load(tmp_path / "missing.yml", environ={})
    scalar = tmp_path / "scalar.yml"
    scalar.write_text("5\n")
    with pytest.raises(cfg.ConfigError, match="mapping"):
        cfg.load(scalar, environ={})


def test_listen_forms():
    assert cfg.parse_listen("127.0.0.1:9847") == ("127.0.0.1", 9847)
    assert cfg.parse_listen(":9847") == ("0.0.0.0", 9847)
    assert cfg.parse_listen("[::1]:0") == ("::1", 0)


def test_flat_values_round_trip():
    config = cfg.load(overrides={"backend": "sim", "sim.gpus": 3}, environ={})
    values = config.values
    assert set(values) == set(cfg.FIELDS)
    assert values["sim.gpus"] == 3
    assert cfg.load(overrides=values, environ={}) == config
