"""wandb tracking: secrets scrubbed, metrics flattened, offline by default, never fatal, resumable.

pytest tests/test_tracking.py
"""

import logging
import struct
import sys
import time

import pytest

from nip_core.parameters import HyperParameters
from nip_core.run.artifacts import RunPaths
from nip_core.run.tracking import (
    REDACTED,
    RUN_ID_FILE,
    NullTracker,
    WandbTracker,
    _records,
    default_mode,
    flatten_metrics,
    iteration_metrics,
    make_tracker,
    offline_logs,
    open_tracker,
    read_offline_history,
    scrub,
    secret_values,
    tracking_run_id,
)

# ------------------------------------------------------------------------------------------
# Pure helpers


def test_secret_values_are_credential_like_env_vars_only():
    env = {
        "OPENAI_API_KEY": "sk-abc123456",
        "NIP_LM_SERVER_TOKEN": "tok-98765",
        "MY_SECRET": "hunter2hunter2",
        "EMPTY_KEY": " ",
        "HOME": "/root",
        "KEYRING": "not-a-key",
    }
    assert set(secret_values(env)) == {"sk-abc123456", "tok-98765", "hunter2hunter2"}


def test_scrub_replaces_secrets_anywhere_in_nested_values():
    secrets = ["sk-abc123456"]
    config = {
        "agents": {"verifier": {"model_name": "sk-abc123456", "temperature": 0.5}},
        "notes": ["Bearer sk-abc123456 here", 3],
        "sk-abc123456": True,
    }
    cleaned = scrub(config, secrets)
    assert cleaned == {
        "agents": {"verifier": {"model_name": REDACTED, "temperature": 0.5}},
        "notes": [f"Bearer {REDACTED} here", 3],
        REDACTED: True,
    }
    assert "sk-abc123456" in config["agents"]["verifier"]["model_name"]  # input untouched


def test_flatten_keeps_numbers_only():
    stats = {
        "verifier": {"accuracy": 0.5, "precision": None},
        "agents": {"prover": {"pairs": 3, "ok": True}},
        "protocol": "nip",
        "history": [1, 2],
    }
    assert flatten_metrics(stats, "train") == {
        "train/verifier/accuracy": 0.5,
        "train/agents/prover/pairs": 3,
        "train/agents/prover/ok": 1.0,
    }


def test_iteration_metrics_separate_train_and_eval():
    stats = {
        "nodes": 10,
        "verifier": {"accuracy": 0.25},
        "models_after": {"verifier": "ft:1"},
        "eval": {"accuracy": 0.75, "models": {"verifier": "base"}, "split": "test"},
    }
    assert iteration_metrics(stats) == {
        "train/nodes": 10,
        "train/verifier/accuracy": 0.25,
        "eval/accuracy": 0.75,
    }


def test_offline_unless_online_is_asked_for(tmp_path):
    no_netrc = {"NETRC": str(tmp_path / "missing")}
    assert default_mode(no_netrc) == "offline"
    assert default_mode({**no_netrc, "WANDB_MODE": "disabled"}) == "disabled"
    # A key or a login alone never goes online: only WANDB_MODE=online does.
    assert default_mode({**no_netrc, "WANDB_API_KEY": "x" * 40}) == "offline"
    assert default_mode({**no_netrc, "WANDB_MODE": "online"}) == "online"
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    assert default_mode({"NETRC": str(netrc)}) == "offline"  # a login alone: still offline


def leveldb_log(payloads: list[bytes], block: int = 32768) -> bytes:
    """Encode payloads the way wandb's transaction log does (checksums left zero)."""
    out = bytearray(b":W&B\xe1\xbe\x00")
    for payload in payloads:
        first = True
        while True:
            left = block - len(out) % block
            if left < 7:
                out += b"\x00" * left
                continue
            chunk, payload = payload[: left - 7], payload[left - 7 :]
            kind = (1 if not payload else 2) if first else (4 if not payload else 3)
            out += struct.pack("<IHB", 0, len(chunk), kind) + chunk
            first = False
            if not payload:
                break
    return bytes(out)


def test_transaction_log_reader_joins_records_across_blocks():
    payloads = [b"a" * 10, b"b" * 70000, b"c" * 32750, b"d"]
    assert list(_records(leveldb_log(payloads))) == payloads
    with pytest.raises(ValueError, match="bad magic"):
        list(_records(b"PK\x03\x04" + b"\x00" * 20))


# ------------------------------------------------------------------------------------------
# The tracker around a fake wandb module


class FakeRun:
    def __init__(self, fail_log=False):
        self.logged, self.defined, self.finished, self.fail_log = [], [], 0, fail_log

    def define_metric(self, name, **kwargs):
        self.defined.append((name, kwargs))

    def log(self, data):
        if self.fail_log:
            raise OSError("disk full")
        self.logged.append(data)

    def finish(self, exit_code=None):
        self.finished += 1


class FakeWandb:
    def __init__(self, fail_init=False, fail_log=False):
        self.calls, self.fail_init, self.run = [], fail_init, FakeRun(fail_log)

    def Settings(self, **kwargs):  # noqa: N802 - mirrors wandb's API
        return kwargs

    def init(self, **kwargs):
        self.calls.append(kwargs)
        if self.fail_init:
            raise RuntimeError("wandb backend did not start")
        return self.run


@pytest.fixture
def no_wandb_setup(monkeypatch, tmp_path):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


def test_tracker_starts_offline_with_scrubbed_config_and_logs_by_iteration(
    no_wandb_setup, monkeypatch, tmp_path
):
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "tok-secret-value")
    fake = FakeWandb()
    tracker = WandbTracker(fake, "abcd1234", str(tmp_path))
    tracker.start("exp1", {"a": {"b": "tok-secret-value"}, "lr": 0.1})
    tracker.start("exp1", {})  # a second start is a no-op
    (init,) = fake.calls
    assert init["mode"] == "offline" and init["id"] == "abcd1234" and init["resume"] == "allow"
    assert init["dir"] == str(tmp_path) and init["name"] == "exp1"
    assert init["project"] == "nip-malt"
    assert init["config"] == {"a": {"b": REDACTED}, "lr": 0.1}
    assert ("*", {"step_metric": "iteration"}) in fake.run.defined
    tracker.log({"train": {"accuracy": 0.5, "protocol": "nip"}}, step=3)
    assert fake.run.logged == [{"train/accuracy": 0.5, "iteration": 3}]
    tracker.finish()
    tracker.finish()
    assert fake.run.finished == 1


def test_tracking_failures_never_stop_the_run(no_wandb_setup, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    broken = WandbTracker(FakeWandb(fail_init=True), "abcd1234", str(tmp_path))
    broken.start("x", {})
    broken.log({"a": 1.0}, 0)
    broken.finish()
    assert "wandb start failed" in caplog.text and "continuing without tracking" in caplog.text
    fake = FakeWandb(fail_log=True)
    flaky = WandbTracker(fake, "abcd1234", str(tmp_path))
    flaky.start("x", {})
    flaky.log({"a": 1.0}, 0)
    flaky.log({"a": 2.0}, 1)  # tracking stopped after the first failure
    assert "wandb log failed" in caplog.text and fake.run.finished == 1


def test_disabled_or_missing_wandb_gives_a_null_tracker(monkeypatch, tmp_path):
    assert isinstance(make_tracker(False, "abcd1234", str(tmp_path)), NullTracker)
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    tracker = make_tracker(True, "abcd1234", str(tmp_path))
    assert isinstance(tracker, NullTracker)
    tracker.start("x", {})
    tracker.log({"a": 1}, 0)
    tracker.finish()


def test_run_id_is_created_once_and_validated(tmp_path):
    paths = RunPaths.open(str(tmp_path), "run")
    first = tracking_run_id(paths)
    assert tracking_run_id(paths) == first
    assert (tmp_path / "run" / RUN_ID_FILE).read_text().strip() == first
    (tmp_path / "run" / RUN_ID_FILE).write_text("Not Valid!\n")
    with pytest.raises(ValueError, match="invalid wandb run id"):
        tracking_run_id(paths)


# ------------------------------------------------------------------------------------------
# Real wandb, offline


def test_offline_run_under_the_run_folder_resumes_the_same_run(no_wandb_setup, tmp_path):
    paths = RunPaths.open(str(tmp_path), "exp")
    hp = HyperParameters.construct_test_params()
    for iteration in (0, 1):  # two processes' worth of starts: a rerun appends
        tracker = open_tracker(paths, hp, "exp")
        tracker.log(iteration_metrics({"verifier": {"accuracy": 0.1 * (iteration + 1)}}), iteration)
        tracker.finish()
    run_id = (tmp_path / "exp" / RUN_ID_FILE).read_text().strip()

    def logged() -> tuple[list, dict]:
        logs = offline_logs(tmp_path / "exp", run_id)
        rows = [row for log in logs for row in read_offline_history(log)]
        return logs, {row["iteration"]: row["train/verifier/accuracy"] for row in rows}

    # wandb's service may still be writing the last start's records as `finish` returns (seen
    # on a loaded 2-core machine): give it a few seconds before reading them
    deadline = time.monotonic() + 30
    logs, accuracy = logged()
    while len(accuracy) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        logs, accuracy = logged()
    assert len(logs) == 2  # one offline log per start, all for the same wandb run id
    assert accuracy == pytest.approx({0: 0.1, 1: 0.2})


def test_no_wandb_writes_nothing(tmp_path):
    paths = RunPaths.open(str(tmp_path), "off")
    tracker = open_tracker(paths, HyperParameters.construct_test_params(), "off", use_wandb=False)
    tracker.log({"a": 1.0}, 0)
    tracker.finish()
    assert not (tmp_path / "off").exists()
