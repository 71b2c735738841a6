"""Node configuration and actor declarations: file, flags, precedence, errors; the start order."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from smartgo.actors.role import node_actors
from smartgo.actors.spec import ActorSpec, SpecError, start_layers
from smartgo.actors.testing import toml_dumps
from smartgo.config import ConfigError, NodeConfig, add_arguments, from_namespace, load_file
from smartgo.node.roles import ROLES


def parse(argv: list[str]) -> NodeConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return from_namespace(parser.parse_args(argv))


def test_defaults_file_then_flags(tmp_path: Path):
    cfg_file = tmp_path / "node.toml"
    cfg_file.write_text(toml_dumps({"role": "registry", "max_restarts": 9, "heartbeat_deadline": 2,
                                    "store_dir": str(tmp_path / "s")}))
    cfg = parse(["--config", str(cfg_file), "--max-restarts", "3"])
    assert cfg.max_restarts == 3                        # flag beats file
    assert cfg.heartbeat_deadline == 2.0                # file beats default (int accepted for float)
    assert cfg.shutdown_timeout == 10.0                 # default
    assert cfg.run_path == tmp_path / "s" / "run" and cfg.log_path == tmp_path / "s" / "logs" / "node.log"
    resolved = cfg.resolved(ROLES["registry"].default_port)
    assert resolved.listen_port == 9876 and Path(resolved.run_dir).is_absolute()
    assert NodeConfig.from_dict(resolved.to_dict()) == resolved


def test_default_store_dir_depends_on_the_role():
    assert NodeConfig(role="master").store_path == Path("~/smartgo/master").expanduser()


@pytest.mark.parametrize("content, message", [
    ("role = 'registry'\nmax_restart = 3\n", "unknown setting 'max_restart'"),
    ("role = 'registry'\nmax_restarts = 'many'\n", "max_restarts must be int"),
    ("role = 'registry'\nstart_method = 'fork'\n", "start_method must be one of forkserver, spawn"),
    ("role = 'registry'\nshutdown_timeout = -1\n", "must not be negative"),
    ("role = \n", "node.toml"),
])
def test_bad_files_name_the_problem(tmp_path: Path, content: str, message: str):
    f = tmp_path / "node.toml"
    f.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_file(f)


def test_extra_actors_from_the_file(tmp_path: Path):
    f = tmp_path / "node.toml"
    f.write_text(toml_dumps({"role": "registry", "actor": [
        {"name": "probe", "cls": "smartgo.actors.testing_actors:RecorderActor", "after": ["registry"],
         "kwargs": {"events": "/tmp/x"}, "heartbeat_deadline": 1.5, "restart": "transient"}]}))
    cfg = NodeConfig.from_dict(load_file(f))
    specs = node_actors(cfg, ROLES["registry"])
    assert [s.name for s in specs] == ["registry", "probe"]
    assert specs[1] == ActorSpec("probe", "smartgo.actors.testing_actors:RecorderActor", {"events": "/tmp/x"},
                                 ("registry",), 1.5, "transient")
    bad = NodeConfig(role="registry", actor=[{"name": "p", "klass": "x:y"}])
    with pytest.raises(SpecError, match="'p'"):
        node_actors(bad, ROLES["registry"])


def test_a_table_naming_one_of_the_roles_actors_sets_its_heartbeat_deadline():
    cfg = NodeConfig(role="registry", actor=[{"name": "registry", "heartbeat_deadline": 0.8}])
    assert [(s.name, s.heartbeat_deadline) for s in node_actors(cfg, ROLES["registry"])] == [("registry", 0.8)]
    other = NodeConfig(role="registry", actor=[{"name": "nobody", "heartbeat_deadline": 0.8}])
    with pytest.raises(SpecError, match="nobody"):          # not one of the role's: an extra actor needs a cls
        node_actors(other, ROLES["registry"])


def _spec(name: str, *after: str) -> ActorSpec:
    return ActorSpec(name, "m:C", after=after)


def test_start_layers_follow_dependencies():
    specs = [_spec("net-0", "commit", "broker"), _spec("commit", "broker"), _spec("broker"), _spec("flush", "commit"),
             _spec("net-1", "commit", "broker")]
    layers = [[s.name for s in layer] for layer in start_layers(specs)]
    assert layers == [["broker"], ["commit"], ["net-0", "flush", "net-1"]]


@pytest.mark.parametrize("specs, message", [
    ([_spec("a", "b"), _spec("b", "a")], "cycle"),
    ([_spec("a", "zzz")], "unknown actor 'zzz'"),
    ([_spec("a"), _spec("a")], "two actors named 'a'"),
])
def test_bad_dependency_graphs(specs, message):
    with pytest.raises(SpecError, match=message):
        start_layers(specs)


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "", "cls": "m:C"}, "1..32 bytes"),
    ({"name": "x" * 33, "cls": "m:C"}, "1..32 bytes"),
    ({"name": "a", "cls": "module.Class"}, "package.module:Class"),
    ({"name": "a", "cls": "m:C", "restart": "sometimes"}, "restart must be"),
])
def test_bad_specs(kwargs, message):
    with pytest.raises(SpecError, match=message):
        ActorSpec(**kwargs)
