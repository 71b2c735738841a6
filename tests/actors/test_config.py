"""Node configuration and actor declarations: file, flags, precedence, errors; the start order."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

import pytest

from smartgo.actors.role import node_actors
from smartgo.actors.spec import ActorSpec, SpecError, start_layers
from tests.support.nodes import toml_dumps
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
    ("role = 'registry'\nacl_enable = 'yes'\n", "acl_enable must be one of true, false, got 'yes'"),
    ("role = 'registry'\nacl_enable = 1\n", "acl_enable must be one of true, false, got 1"),
    ("role = \n", "node.toml"),
])
def test_bad_files_name_the_problem(tmp_path: Path, content: str, message: str):
    f = tmp_path / "node.toml"
    f.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_file(f)


def test_flag_settings_hold_bools_from_true_false_in_the_file_and_the_flags(tmp_path: Path):
    """A boolean setting is a bool in code; the file and the flags take RocketMQ's true/false (and
    the file TOML's own booleans); the help shows the default as true/false."""
    f = tmp_path / "node.toml"
    f.write_text("role = 'master'\nacl_enable = 'true'\nauto_create_topic = 'false'\ntls_enable = true\n")
    cfg = parse(["--config", str(f), "--slave-read-enable", "true", "--store-reply-message", "false"])
    assert (cfg.acl_enable, cfg.auto_create_topic, cfg.tls_enable, cfg.slave_read_enable,
            cfg.store_reply_message, cfg.trace_topic_enable, cfg.timer_wheel_enable) == (
        True, False, True, True, False, False, True)
    assert NodeConfig.from_dict(cfg.resolved(10911).to_dict()).acl_enable is True     # what the actors receive
    flags = [x.name for x in fields(NodeConfig) if x.metadata["type"] is bool]
    assert len(flags) >= 12 and all(type(getattr(NodeConfig(), name)) is bool for name in flags)
    assert not [x.name for x in fields(NodeConfig) if x.default in ("true", "false")]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert all(f"--{name.replace('_', '-')} {{true,false}} " in text for name in flags)
    assert "(enablePropertyFilter) (default: true)" in text and "broker registrations (default: false)" in text


@pytest.mark.parametrize("value", ["yes", "True", ""])
def test_a_flag_setting_refuses_anything_but_true_or_false(value: str, capsys):
    with pytest.raises(SystemExit):
        parse(["--role", "master", "--acl-enable", value])
    assert f"--acl-enable: invalid choice: {value!r} (choose from 'true', 'false')" in capsys.readouterr().err


def test_extra_actors_from_the_file(tmp_path: Path):
    f = tmp_path / "node.toml"
    f.write_text(toml_dumps({"role": "registry", "actor": [
        {"name": "probe", "cls": "tests.support.actors:RecorderActor", "after": ["registry"],
         "kwargs": {"events": "/tmp/x"}, "heartbeat_deadline": 1.5, "restart": "transient"}]}))
    cfg = NodeConfig.from_dict(load_file(f))
    specs = node_actors(cfg, ROLES["registry"])
    assert [s.name for s in specs] == ["registry", "probe"]
    assert specs[1] == ActorSpec("probe", "tests.support.actors:RecorderActor", {"events": "/tmp/x"},
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
