"""The server's limits: body size, sampling bounds, safe names and paths, unknown ids, and a
token when it listens beyond loopback."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.conftest_lm import REPO, running_server

BASE = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(["--engine", "dummy"], tmp_path_factory.mktemp("limits") / "state") as srv:
        yield srv


def post(server, path: str, **kwargs) -> httpx.Response:
    return httpx.post(server.url + path, timeout=30, **kwargs)


def test_a_huge_chat_body_is_refused_with_413(server):
    big = {"model": BASE, "messages": [{"role": "user", "content": "x" * (9 * 2**20)}]}
    response = post(server, "/v1/chat/completions", json=big)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_a_huge_body_without_content_length_is_refused_while_it_streams(server):
    def chunks():
        yield b'{"model": "' + BASE.encode() + b'", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 2**20
        yield b'"}]}'

    response = post(server, "/v1/chat/completions", content=chunks())
    assert response.status_code == 413


def test_sampling_bounds(server):
    messages = [{"role": "user", "content": "hi"}]
    for field, value in [("max_tokens", 10**6), ("n", 1000), ("temperature", 5.0)]:
        response = post(
            server, "/v1/chat/completions", json={"model": BASE, "messages": messages, field: value}
        )
        assert response.status_code == 400, (field, response.text)
        assert response.json()["error"]["param"] == field


@pytest.mark.parametrize("name", ["../../evil", "a/b", "", "-x", "x" * 300, "a..b"])
def test_adapter_names_are_plain(server, tmp_path, name):
    response = post(
        server, "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(tmp_path)}
    )
    assert response.status_code == 400, response.text


def test_adapters_load_only_from_the_state_folder(server, tmp_path):
    response = post(
        server, "/v1/load_lora_adapter", json={"lora_name": "mine", "lora_path": str(tmp_path)}
    )
    assert response.status_code == 400 and "outside the server's state folder" in response.text
    inside = server.state_dir / "adapters-by-hand"
    inside.mkdir(parents=True, exist_ok=True)
    response = post(
        server, "/v1/load_lora_adapter", json={"lora_name": "mine", "lora_path": str(inside)}
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("file_id", ["file-doesnotexist", "../../etc/passwd", "file-a/b"])
def test_unknown_training_files_are_404(server, file_id):
    body = {"model": BASE, "training_file": file_id, "method": {"type": "supervised"}}
    response = post(server, "/v1/fine_tuning/jobs", json=body)
    assert response.status_code == 404, response.text


def test_job_suffix_is_validated(server):
    upload = server.client().files.create(
        file=("t.jsonl", b'{"messages": [{"role": "user", "content": "a"}]}\n'),
        purpose="fine-tune",
    )
    body = {"model": BASE, "training_file": upload.id, "suffix": "../evil name"}
    response = post(server, "/v1/fine_tuning/jobs", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "suffix"


def test_listening_beyond_loopback_needs_a_token(tmp_path):
    command = [sys.executable, "-m", "nip_core.lm_server", "--engine", "dummy"]
    command += ["--host", "0.0.0.0", "--port", "1", "--state-dir", str(tmp_path)]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "NIP_LM_SERVER_TOKEN" in done.stderr
