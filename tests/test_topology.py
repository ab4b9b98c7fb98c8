"""The settings file's `topology:` section: it loads into flopwatch.mixin.topology's dataclasses,
each wrong value is one line naming file and line, and `flopwatch rules topology` probes the URLs
it names (exit 2 on a problem, a closed loopback port standing for a server that is down)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from flopwatch.cli import main
from flopwatch.config import ConfigError
from flopwatch.mixin import topology
from flopwatch.mixin.config import MixinConfig, as_dict, load
from flopwatch.mixin.topology import AlertmanagerPeer, GlobalTier, Shard, Topology
from flopwatch.stack.servers import Alertmanager, VictoriaMetrics

ROOT = Path(__file__).resolve().parents[1]
WRITE = "http://vminsert:8480/insert/0/prometheus/api/v1/write"
READ = "http://vmselect:8481/select/0/prometheus"
SECTION = f"""\
topology:
  replica_label: replica
  shards:
    - {{name: shard-1, replicas: [a, b], gpus: 5000}}
    - {{name: shard-2}}
  global:
    write_url: {WRITE}
    read_url: {READ}
  alertmanagers:
    - {{url: http://am-1:9093, peer: am-1:9094}}
    - {{url: http://am-2:9093/, peer: am-2:9094}}
"""


def settings(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fw.yml"
    path.write_text(text)
    return path


def test_the_section_loads_into_the_topology(tmp_path: Path) -> None:
    config = load(settings(tmp_path, SECTION))
    assert config.topology == Topology(
        shards=(Shard("shard-1", ("a", "b"), 5000), Shard("shard-2")),
        global_tier=GlobalTier(WRITE, READ),
        alertmanagers=(AlertmanagerPeer("http://am-1:9093", "am-1:9094"),
                       AlertmanagerPeer("http://am-2:9093", "am-2:9094")),   # trailing slash dropped
        replica_label="replica")
    assert as_dict(config)["topology"]["global"] == {"write_url": WRITE, "read_url": READ}
    assert "topology" not in as_dict(MixinConfig())                        # the default: none


def test_it_is_checked_against_settings_written_after_it(tmp_path: Path) -> None:
    """vote_min_peers and the cluster label may come later in the file than the topology."""
    text = SECTION.replace("gpus: 5000", "gpus: 4") + "stragglers:\n  vote_min_peers: 5\n"
    with pytest.raises(ConfigError, match=r"fw.yml:4: topology.shards\[0\].gpus: 4 GPUs are fewer than "
                                          r"stragglers.vote_min_peers \(5\)"):
        load(settings(tmp_path, text))
    renamed = SECTION.replace("replica_label: replica", "replica_label: site") + "labels:\n  cluster: site\n"
    with pytest.raises(ConfigError, match=r"fw.yml:2: topology.replica_label: 'site' is already the label of "
                                          r"labels.cluster"):
        load(settings(tmp_path, renamed))
    default = SECTION.replace("  replica_label: replica\n", "") + "labels:\n  cluster: replica\n"
    with pytest.raises(ConfigError, match=r"fw.yml:2: topology.replica_label: 'replica' is already the label of "
                                          r"labels.cluster"):
        load(settings(tmp_path, default))


def test_the_shards_split_one_cluster_named_by_the_section(tmp_path: Path) -> None:
    """Every shard carries the cluster's name, so a job spanning shards is one job of one cluster."""
    assert load(settings(tmp_path, SECTION)).topology.cluster == "default"
    named = SECTION.replace("  replica_label: replica\n",
                            "  replica_label: copy\n  cluster: eu-1\n  shard_label: part\n")
    topology = load(settings(tmp_path, named)).topology
    assert (topology.cluster, topology.shard_label, topology.replica_label) == ("eu-1", "part", "copy")


def test_the_example_in_defaults_yml_loads(tmp_path: Path) -> None:
    """defaults.yml ends with the section commented out: uncommented, it is a valid topology."""
    text = (ROOT / "flopwatch" / "mixin" / "defaults.yml").read_text()
    example = text[text.index("# topology:"):]
    lines = [line[2:] if line.startswith("# ") else line.lstrip("#") for line in example.splitlines()]
    config = load(settings(tmp_path, "\n".join(lines)))
    assert config.topology is not None
    assert [shard.name for shard in config.topology.shards] == ["shard-1", "shard-2"]


@pytest.mark.parametrize(("old", "new", "message"), [
    ("    - {name: shard-2}", "    - {name: shard-1}",
     "fw.yml:5: topology.shards[1].name: shard 'shard-1' is listed twice"),
    ("replicas: [a, b]", "replicas: [a, a]", "fw.yml:4: topology.shards[0].replicas: replica 'a' is listed twice in "
     "shard 'shard-1'"),
    ("replicas: [a, b]", "replicas: []", "fw.yml:4: topology.shards[0].replicas: expected a list of at least one"),
    ("replica_label: replica", "replica_label: cluster", "fw.yml:2: topology.replica_label: 'cluster' is already the "
     "label of labels.cluster"),
    ("replica_label: replica", "replica_label: shard", "fw.yml:2: topology.replica_label: 'shard' is already the "
     "label of topology.shard_label"),
    ("replica_label: replica", "replica_label: replica\n  cluster: eu west",
     "fw.yml:3: topology.cluster: expected a name of letters"),
    ("gpus: 5000", "gpus: 2", "fw.yml:4: topology.shards[0].gpus: 2 GPUs are fewer than stragglers.vote_min_peers (3)"),
    (f"write_url: {WRITE}", "write_url: vminsert:8480/insert", "fw.yml:7: topology.global.write_url: expected an "
     "absolute http(s):// URL, got 'vminsert:8480/insert'"),
    ("url: http://am-1:9093,", "url: ftp://am-1:9093,", "fw.yml:10: topology.alertmanagers[0].url: expected an "
     "absolute http(s):// URL"),
    (SECTION[SECTION.index("  alertmanagers:"):], "  alertmanagers: []\n",
     "fw.yml:9: topology.alertmanagers: expected a list of at least one"),
    ("peer: am-1:9094", "peer: am-1", "fw.yml:10: topology.alertmanagers[0].peer: expected host:port"),
    ("{name: shard-2}", "{name: shard 2}", "fw.yml:5: topology.shards[1].name: expected a name of letters"),
    ("{name: shard-2}", "{nme: shard-2}",
     "fw.yml:5: unknown setting 'topology.shards[1].nme' (known here: name, replicas, gpus)"),
    ("    read_url: " + READ + "\n", "", "fw.yml:7: topology.global: missing read_url"),
])
def test_each_wrong_value_is_one_line_naming_file_and_line(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert old in SECTION
    with pytest.raises(ConfigError) as error:
        load(settings(tmp_path, SECTION.replace(old, new)))
    assert str(error.value).startswith(f"{tmp_path}/{message}"), str(error.value)
    assert "\n" not in str(error.value)


def test_no_alertmanagers_key_is_refused(tmp_path: Path) -> None:
    text = SECTION[:SECTION.index("  alertmanagers:")]
    with pytest.raises(ConfigError, match=r"fw.yml:2: topology: missing alertmanagers"):
        load(settings(tmp_path, text))


# --- probing --------------------------------------------------------------------------------------
@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound but never listening: a connection to it is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def layout(write: str, read: str, *alertmanagers: str) -> Topology:
    return Topology((Shard("shard-1"),), GlobalTier(write, read),
                    tuple(AlertmanagerPeer(url, f"127.0.0.1:{9094 + i}") for i, url in enumerate(alertmanagers)))


def test_check_names_each_url_that_does_not_answer(closed_port: int) -> None:
    down = f"http://127.0.0.1:{closed_port}"
    problems = topology.check(layout(down + "/api/v1/write", down, down), timeout=1)
    assert [line.split(" is unreachable")[0] for line in problems] == [
        f"global write URL {down}/api/v1/write", f"global read URL {down}", f"Alertmanager {down}"]
    assert all("refused" in line.lower() for line in problems), problems
    only_shard = topology.check(layout(down + "/api/v1/write", down, down), timeout=1, shard="shard-1")
    assert len(only_shard) == 2 and not any("read URL" in line for line in only_shard)   # shards never read
    with pytest.raises(ValueError, match=r"no shard 'shard-9' in the topology \(shards: shard-1\)"):
        topology.check(layout(down, down, down), shard="shard-9")


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[VictoriaMetrics, Alertmanager]]:
    quiet = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
    with VictoriaMetrics() as store, Alertmanager(quiet) as am:
        yield store, am


def test_check_passes_real_servers_and_tells_a_wrong_path(servers: tuple[VictoriaMetrics, Alertmanager]) -> None:
    store, am = servers
    assert topology.check(layout(store.url + "/api/v1/write", store.url, am.url)) == []
    wrong = topology.check(layout(store.url + "/nothing/api/v1/write", am.url, am.url))
    assert [line.split(" answered")[0] for line in wrong] == [
        f"global write URL {store.url}/nothing/api/v1/write", f"global read URL {am.url}"]
    assert "HTTP 400 (POST)" in wrong[0] and "HTTP 404 (GET /api/v1/query?query=1)" in wrong[1], wrong


# --- the command ----------------------------------------------------------------------------------
def test_rules_topology_exits_2_on_each_problem(tmp_path: Path, closed_port: int,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    down = f"http://127.0.0.1:{closed_port}"
    text = SECTION.replace(WRITE, down + "/api/v1/write").replace(READ, down) \
        .replace("http://am-1:9093", down).replace("http://am-2:9093/", down + "/am2")
    path = settings(tmp_path, text)
    assert main(["rules", "topology", "--config", str(path), "--timeout", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("flopwatch rules: ") and "unreachable" in line for line in err), err
    assert main(["rules", "topology", "--config", str(path), "--shard", "shard-3"]) == 2
    assert capsys.readouterr().err.strip() == ("flopwatch rules: no shard 'shard-3' in the topology "
                                               "(shards: shard-1, shard-2)")
    bad = settings(tmp_path, SECTION.replace("replicas: [a, b]", "replicas: [a, a]"))
    assert main(["rules", "topology", "--config", str(bad)]) == 2
    assert "replica 'a' is listed twice" in capsys.readouterr().err
    assert main(["rules", "topology", "--config", str(path), "--timeout", "0"]) == 2
    assert capsys.readouterr().err.strip() == ("flopwatch rules: --timeout must be a number of seconds more than 0, "
                                               "got 0")
    none = settings(tmp_path, "dtype: fp8\n")
    assert main(["rules", "topology", "--config", str(none)]) == 2
    assert capsys.readouterr().err.strip() == (f"flopwatch rules: {none} has no topology: section "
                                               "(docs/configuration.md, \"Topology\")")


def test_rules_topology_summarises_a_reachable_topology(tmp_path: Path, servers: tuple[VictoriaMetrics, Alertmanager],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    store, am = servers
    text = SECTION.replace(WRITE, store.url + "/api/v1/write").replace(READ, store.url) \
        .replace("    - {url: http://am-2:9093/, peer: am-2:9094}\n", "").replace("http://am-1:9093", am.url)
    path = settings(tmp_path, text)
    assert main(["rules", "topology", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 shard(s): shard-1 (replicas a, b, 5000 GPUs); shard-2 (replicas a, b)" in out
    assert out.strip().endswith("all reachable")
    assert main(["rules", "topology", "--config", str(path), "--shard", "shard-2"]) == 0
    assert "1 shard(s): shard-2 (replicas a, b)" in capsys.readouterr().out


def test_every_new_option_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["rules", "topology", "--help"])
    text = capsys.readouterr().out
    for option in ("--config", "--shard", "--timeout"):
        assert option in text
    assert "exits 2" in text
