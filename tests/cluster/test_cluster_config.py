"""The cluster launcher's configuration and worker checks (no model, no router process):
bad configurations are refused with a message that names the flag, the URL and what was
found; the router gets the failover settings the README documents."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sglang_saria.cluster import ClusterConfig, ClusterError, RouterSettings
from sglang_saria.cluster.cli import main
from sglang_saria.cluster.workers import check_workers
from sglang_saria.launcher import free_port
from tests.cluster.model_list_server import model_list_server


def test_workers_serving_one_model_pass_the_check():
    with model_list_server("qwen3-tiny") as a, model_list_server("qwen3-tiny") as b:
        infos = check_workers([a, b])
    assert [(i.url, i.model) for i in infos] == [(a, "qwen3-tiny"), (b, "qwen3-tiny")]


def test_a_worker_serving_another_model_is_refused_naming_both():
    with model_list_server("qwen3-tiny") as a, model_list_server("llama-8b") as b:
        with pytest.raises(ClusterError) as err:
            check_workers([a, b])
    message = str(err.value)
    assert f"{a} serves 'qwen3-tiny'" in message and f"{b} serves 'llama-8b'" in message
    assert "--served-model-name" in message


def test_no_reachable_worker_is_refused_naming_each_url():
    urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    with pytest.raises(ClusterError) as err:
        check_workers(urls)
    message = str(err.value)
    assert message.startswith("no worker is reachable") and all(url in message for url in urls)
    assert "Connection refused" in message


def test_one_unreachable_worker_of_two_is_refused():
    down = f"http://127.0.0.1:{free_port()}"
    with model_list_server("qwen3-tiny") as up:
        with pytest.raises(ClusterError, match=r"1 of 2 workers are not reachable \(http://127\.0\.0\.1:\d+: "):
            check_workers([up, down])


def test_something_that_is_not_an_sglang_worker_is_named():
    with model_list_server("m") as url:
        with pytest.raises(ClusterError, match="HTTP 404 on /v1/models"):
            check_workers([url + "/not-here"])


def test_router_flags_carry_the_failover_settings():
    flags = RouterSettings().flags()
    pairs = dict(zip(flags[::2], flags[1::2]))
    assert pairs["--policy"] == "cache_aware"
    # 3 failed attempts open the dead worker's circuit; the attempts left go to a live one
    assert pairs["--cb-failure-threshold"] == "3" and int(pairs["--retry-max-retries"]) >= 5
    assert pairs["--health-check-interval-secs"] == "5" and pairs["--cb-timeout-duration-secs"] == "10"
    assert RouterSettings(extra=("--cache-threshold", "0.5")).flags()[-2:] == ["--cache-threshold", "0.5"]


@pytest.mark.parametrize("kwargs, words", [
    ({"policy": "sticky"}, "--policy 'sticky': choose one of cache_aware"),
    ({"cb_failure_threshold": 0}, "cb_failure_threshold=0: must be >= 1"),
    ({"health_check_interval_secs": 0}, "health_check_interval_secs=0: must be >= 1"),
])
def test_bad_router_settings_are_named(kwargs, words):
    with pytest.raises(ClusterError, match=words):
        RouterSettings(**kwargs)


@pytest.mark.parametrize("kwargs, words", [
    ({"workers": 0}, "--workers 0: need at least one worker"),
    ({"workers": 2, "worker_ports": [31000]}, "1 worker ports for 2 workers"),
    ({"extra_config": {"data_dirs": ["/x"]}}, "data_dirs is set per worker"),
])
def test_bad_cluster_configs_are_named(kwargs, words):
    with pytest.raises(ClusterError, match=words):
        ClusterConfig(Path("models/qwen3-tiny"), Path("/tmp/stores"), **kwargs)


@pytest.mark.parametrize("argv, words", [
    (["--workers", "2"], "error: --workers needs --model-path"),
    (["--workers", "2", "--model-path", "m", "--extra-config", "{not json"], "error: --extra-config is not valid JSON"),
    (["--workers", "2", "--model-path", "m", "--extra-config", "[1]"], "error: --extra-config must be a JSON object, got list"),
    (["--worker-urls", "http://127.0.0.1:9", "--", "--tp", "2"], "error: flags after -- are for local workers"),
    (["--worker-urls", "http://127.0.0.1:9", "--policy", "session", "--session-wear-shrink", "-1"],
     "error: --session-*: session wear_shrink -1.0: must be >= 0"),
])
def test_cli_refuses_bad_flags_with_exit_status_2(argv, words, capsys):
    assert main(argv) == 2
    assert words in capsys.readouterr().err


def test_cli_refuses_unreachable_worker_urls(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["--worker-urls", url]) == 2
    err = capsys.readouterr().err
    assert f"error: no worker is reachable ({url}: " in err and "fix --worker-urls" in err


def test_cli_refuses_a_router_port_in_use(capsys):
    with model_list_server("m") as url, socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["--worker-urls", url, "--port", str(port)]) == 2
    assert f"error: --port {port}: already in use on 127.0.0.1" in capsys.readouterr().err
