"""bench/dpo_job_phases.py reads a job's phases off its events: each phase ends at its event's
stamp, a phase whose event is missing is folded into the next, and the trainer's runtime is the
last one logged."""

from bench.dpo_job_phases import phases, train_runtime


def _event(at: int, message: str, data: dict | None = None) -> dict:
    return {"created_at": at, "message": message, "data": data}


EVENTS = [
    _event(102, "Training process started; validating the training file"),
    _event(103, "Training file validated: 64 examples"),
    _event(140, "Training dpo (lora adapter) on 64 examples on cuda:0", {"device": "cuda:0"}),
    _event(145, "Step 1/128: loss=0.69", {"step": 1, "loss": 0.69}),
    _event(276, "Step 128/128: loss=0.1", {"step": 128, "loss": 0.1}),
    _event(276, "Step 128/128: train_loss=0.3", {"step": 128, "train_runtime": 135.4}),
]


def test_each_phase_ends_at_its_event():
    assert phases(100, 278, EVENTS) == [
        ("queued until the training child started", 2),
        ("validating the training file", 1),
        ("loading the model, building the trainer", 37),
        ("up to the first logged step", 5),
        ("steps", 131),
        ("saving, until finished", 2),
    ]
    assert train_runtime(EVENTS) == 135.4


def test_a_missing_event_folds_its_phase_into_the_next():
    without_device = [e for e in EVENTS if not e["message"].startswith("Training dpo")]
    got = dict(phases(100, 278, without_device))
    assert "loading the model, building the trainer" not in got
    assert got["up to the first logged step"] == 42
    assert sum(got.values()) == 178
    assert train_runtime(EVENTS[:4]) is None
