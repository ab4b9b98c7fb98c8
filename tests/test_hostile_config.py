"""Absurd and hostile configuration: every value is refused with one line naming the key and what
is expected, and nothing a config file holds can hang or exhaust the agent before it starts.
(tests/test_config.py covers ordinary mistakes; tests/test_webconfig.py the web config.)"""

from __future__ import annotations

import pytest

from flopwatch import config as cfg
from flopwatch import yamlfile
from flopwatch.exporters import webconfig

NUMBERS = ["interval", "gpu.timeout", "train.expiry", "influx.flush_interval", "gpu.peak_flops"]
INTEGERS = ["sim.gpus", "sim.seed", "train.max_jobs", "train.max_ranks", "influx.batch_size"]
ABSURD = ["nan", "inf", "-inf", "1e309", "-1", "9" * 5000, "0x10", True, [5], {"a": 1}, "5 seconds"]


def short(value: object) -> str:
    return repr(value)[:20]


@pytest.mark.parametrize("key", NUMBERS + INTEGERS)
@pytest.mark.parametrize("value", ABSURD, ids=short)
def test_absurd_numbers_are_refused_naming_the_key(key, value):
    with pytest.raises(cfg.ConfigError) as caught:
        cfg.load(overrides={key: value}, environ={})
    message = str(caught.value)
    assert message.startswith(f"{key} = ") and "expected" in message and "\n" not in message
    assert len(message) < 400, "the message quotes the whole absurd value"


@pytest.mark.parametrize("key", [key for key in NUMBERS + INTEGERS if cfg.FIELDS[key].default is not None])
@pytest.mark.parametrize("value", ["", "  "])
def test_empty_numbers_are_refused_unless_the_setting_is_optional(key, value):
    with pytest.raises(cfg.ConfigError, match=f"^{key.replace('.', '[.]')} = "):
        cfg.load(overrides={key: value}, environ={})


@pytest.mark.parametrize("value", ["", ":", "::::", "host", "[::1]:-1", "a:99999", "1.2.3.4:8o", "a b:80x",
                                   ":" + "9" * 5000], ids=short)
def test_absurd_listen_addresses(value):
    with pytest.raises(cfg.ConfigError, match=r"^listen = .*expected HOST:PORT"):
        cfg.load(overrides={"listen": value}, environ={})


@pytest.mark.parametrize("value", ["x" * 300, "node\nname", "node\x00", "tab\there", [1], {"a": "b"}], ids=short)
def test_absurd_node_names(value):
    with pytest.raises(cfg.ConfigError) as caught:
        cfg.load(overrides={"node": value}, environ={})
    assert str(caught.value).startswith("node = ") and "\n" not in str(caught.value)


@pytest.mark.parametrize(("key", "value"), [
    ("influx.buffer_max_bytes", "1e30GiB"), ("influx.buffer_max_bytes", "-5MiB"), ("influx.buffer_max_bytes", "5PB"),
    ("influx.url", "file:///etc/passwd"), ("influx.url", "http://"), ("influx.url", "http://a b"),
    ("nic.net_exclude", "(unclosed"), ("backend", "nvml; rm -rf /"), ("log_level", "TRACE"),
    ("collectors.gpu", "maybe"), ("attribution.nic_rails", "0=,x=mlx5_0"),
])
def test_other_absurd_values(key, value):
    with pytest.raises(cfg.ConfigError, match=rf"^{key.replace('.', '[.]')} = "):
        cfg.load(overrides={key: value}, environ={})


class BoundedReads:
    """Stands in for `open` in flopwatch/yamlfile.py: the real file, but a read without a size (one
    that would never end on /dev/zero) fails the test instead of hanging it."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, path, mode="r"):
        spy, real = self, open(path, mode)  # noqa: SIM115 (closed by the caller's `with`)

        class File:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                real.close()

            def read(self, size: int = -1) -> bytes:
                assert size is not None and size >= 0, "a config file read without a size limit"
                spy.sizes.append(size)
                return real.read(size)

        return File()


def test_a_huge_or_endless_config_file_is_refused_after_reading_its_limit(tmp_path, monkeypatch):
    reads = BoundedReads()
    monkeypatch.setattr(yamlfile, "open", reads, raising=False)
    big = tmp_path / "big.yml"
    big.write_text("# padding\n" * 200_000)
    with pytest.raises(cfg.ConfigError, match="larger than"):
        cfg.load(big, environ={})
    with pytest.raises(cfg.ConfigError, match="larger than"):
        cfg.load("/dev/zero", environ={})
    with pytest.raises(webconfig.WebConfigError, match="larger than"):
        webconfig.load("/dev/zero")
    assert reads.sizes == [yamlfile.MAX_FILE_BYTES + 1] * 3       # one bounded read each, then refused


def test_a_yaml_alias_bomb_is_refused_without_expanding_it(tmp_path, monkeypatch):
    lines = ["l0: &l0 {a: 1, b: 1}"]
    lines += [f"l{i}: &l{i} {{a: *l{i - 1}, b: *l{i - 1}}}" for i in range(1, 40)]  # 2**40 paths when flattened
    bomb = tmp_path / "bomb.yml"
    bomb.write_text("\n".join(lines) + "\n")
    flatten, calls = cfg._flatten, []

    def counted(*args, **kwargs):       # every mapping the flattening walks, aliases followed
        calls.append(1)
        assert len(calls) <= 2000, "the alias graph is being expanded (2**40 paths)"
        return flatten(*args, **kwargs)

    monkeypatch.setattr(cfg, "_flatten", counted)
    with pytest.raises(cfg.ConfigError) as caught:
        cfg.load(bomb, environ={})
    assert "more than 1000 settings" in str(caught.value) and "\n" not in str(caught.value)
    assert len(calls) <= cfg.MAX_FILE_KEYS      # stopped at the cap, not 2**40 paths later


def test_deeply_nested_config_is_refused(tmp_path):
    deep = tmp_path / "deep.yml"
    deep.write_text("gpu:\n  timeout:\n    really:\n      deep: 1\n")
    with pytest.raises(cfg.ConfigError, match=r"unknown key 'gpu[.]timeout[.]really[.]deep'"):
        cfg.load(deep, environ={})


def test_binary_garbage_as_a_config_file(tmp_path):
    garbage = tmp_path / "garbage.yml"
    garbage.write_bytes(bytes(range(256)) * 10)
    with pytest.raises(cfg.ConfigError) as caught:
        cfg.load(garbage, environ={})
    assert str(caught.value).startswith(f"config file {garbage}: ")
