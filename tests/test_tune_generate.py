"""``opdvfs tune --mode generate``: a generation loop tuned per phase (prefill, decode).

The pure parts (the phase classifier, the A/B scoring, the choice) on made-up steps; the loop
on the real ``transformers`` package: a tiny randomly initialised GPT-2 (examples/
generate_gpt2.py) generating with a KV cache on ``sim:a100-like``, its work scaled so that its
prefill is compute-bound and its decode memory-bound.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opdvfs.tuner.generate_result import GenIteration, choose, score_round
from opdvfs.tuner.phases import bucket_key, classify_phase, forward_tokens
from opdvfs.tuner.result import Interval

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SIM = ("--actuator", "sim:a100-like", "--work-scale", "800")
TOP_MHZ = 1410.0


# ----------------------------------------------------------------------------- the classifier
def test_a_first_forward_or_several_tokens_is_prefill_one_token_is_decode():
    assert classify_phase(1, first_of_request=True) == "prefill"
    assert classify_phase(1, first_position=0) == "prefill"  # cache_position starts at 0
    assert classify_phase(37) == "prefill"
    assert classify_phase(None) == "prefill"  # unknown: the safe side (the top clock's plan)
    assert classify_phase(1) == "decode"
    assert classify_phase(1, first_position=40) == "decode"


class _Shape:
    def __init__(self, *dims: int, first: int = 0) -> None:
        self.shape = dims
        self._first = first

    def reshape(self, *_: int) -> list[int]:
        return [self._first]


def test_forward_tokens_reads_ids_embeddings_or_the_first_tensor():
    t = forward_tokens((), {"input_ids": _Shape(4, 1), "cache_position": _Shape(1, first=57)})
    assert (t.batch, t.seq_len, t.first_position) == (4, 1, 57)
    t = forward_tokens((), {"input_ids": _Shape(1, 1), "position_ids": _Shape(1, 1, first=9)})
    assert (t.seq_len, t.first_position) == (1, 9)
    t = forward_tokens((), {"inputs_embeds": _Shape(2, 9, 64)})
    assert (t.batch, t.seq_len, t.first_position) == (2, 9, None)
    t = forward_tokens(("not a tensor", _Shape(3, 5)), {})
    assert (t.batch, t.seq_len) == (3, 5)
    assert forward_tokens((), {}).seq_len is None
    # decode steps of any length share their bucket: the operator count, not the length
    assert bucket_key("decode", 126) == bucket_key("decode", 126) != bucket_key("prefill", 126)


# ----------------------------------------------------------------------------- the scoring
def _rows(pairs: int, *, t_prefill: float, t_decode: float, e_ratio: float) -> list[GenIteration]:
    """ABBA requests of one prefill (128 tokens) and 4 decode steps; tuned slower, cheaper."""
    rows: list[GenIteration] = []
    i = 0
    for pair in range(pairs):
        for kind in ("reference", "tuned") if pair % 2 == 0 else ("tuned", "reference"):
            slow = kind == "tuned"
            rows.append(
                GenIteration(
                    i, "prefill", 1, 128, kind, None, 0, pair,
                    0.020 * (t_prefill if slow else 1.0) * (1 + 0.001 * pair),
                    5.0 * (e_ratio if slow else 1.0), 130,
                )
            )  # fmt: skip
            i += 1
            for _ in range(4):
                rows.append(
                    GenIteration(
                        i, "decode", 1, 1, kind, None, 0, pair,
                        0.007 * (t_decode if slow else 1.0), 1.0 * (e_ratio if slow else 1.0), 126,
                    )
                )  # fmt: skip
                i += 1
    return rows


def test_score_round_measures_ttft_tpot_and_energy_per_token_with_intervals():
    rows = _rows(4, t_prefill=1.03, t_decode=1.01, e_ratio=0.8)
    r = score_round(
        "x", rows, buckets={"prefill": 130, "decode": 126}, clocks_mhz={"prefill": [1305.0]}
    )
    assert r.ttft.mean == pytest.approx(0.03, abs=1e-3)
    assert r.ttft.n == 4 and r.ttft.low <= r.ttft.mean <= r.ttft.high
    assert r.tpot.mean == pytest.approx(0.01, abs=1e-9)
    assert r.saving.mean == pytest.approx(0.2, abs=1e-9)
    # energy per token: (5 + 4 * 1) J over 5 tokens per request
    assert r.ref_j_per_token == pytest.approx(9 / 5)
    assert r.j_per_token == pytest.approx(0.8 * 9 / 5)
    assert r.j_per_request == pytest.approx(0.8 * 9)
    assert r.tpot_s == pytest.approx(0.00707)


def _round(saving: float, ttft_high: float, tpot_high: float = 0.0):
    iv = Interval(saving, saving - 0.01, saving + 0.01, 3)
    r = score_round("x", [], buckets={"prefill": 1, "decode": 1}, clocks_mhz={})
    r.saving, r.ttft, r.tpot = iv, Interval(0.0, -0.01, ttft_high, 3), Interval(0, 0, tpot_high, 3)
    return r


def test_choose_takes_the_surest_saving_within_both_targets():
    rounds = [_round(0.30, 0.08), _round(0.12, 0.04), _round(0.10, 0.01), _round(0.2, 0.0, 0.07)]
    assert choose(rounds, 0.05, 0.05) == (1, True)
    assert choose([_round(0.3, 0.08)], 0.05, 0.05) == (None, False)
    assert choose([_round(-0.02, 0.0)], 0.05, 0.05) == (None, False)  # no saving: top clock


# ----------------------------------------------------------------------------- the loop
def _example():
    pytest.importorskip("transformers")
    sys.path.insert(0, str(EXAMPLES))
    try:
        import generate_gpt2
    finally:
        sys.path.remove(str(EXAMPLES))
    return generate_gpt2


#: Requests the in-process loop serves: tuning ends, and the steady phase begins, at request 53
#: whatever the host's load (the simulated GPU's timeline, and planning on the stepping thread);
#: 60 leaves 7 steady requests (80 took ~21 CPU-s, 60 ~17 with the same rounds and figures).
GEN_REQUESTS = 60
#: Requests of the command-line run with varied lengths (seeded): its last round ends at
#: request 65, steady from there on; 72 leaves 7 steady requests (90 took ~33 CPU-s).
VARY_REQUESTS = 72


@pytest.mark.slow  # ~17 s of CPU: 60 requests through HF generate() on the simulated GPU
def test_generate_on_a_tiny_gpt2_runs_decode_below_prefill_within_both_targets(tmp_path):
    import opdvfs

    example = _example()
    model = example.tiny_gpt2()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opdvfs.tune(
            0.05, actuator="sim:a100-like", work_scale=800, mode="generate", out=tmp_path
        ) as t:
            example.serve(model, GEN_REQUESTS)
    res = t.result
    assert res.error is None, res.error
    assert res.met and res.chosen is not None
    chosen = res.rounds[res.chosen]
    # decode below the top clock; prefill near it, above decode
    assert max(chosen.clocks_mhz["decode"]) < TOP_MHZ
    assert min(chosen.clocks_mhz["prefill"]) >= 0.9 * TOP_MHZ
    assert min(chosen.clocks_mhz["prefill"]) > max(chosen.clocks_mhz["decode"])
    # the measured slowdowns' upper 95% bounds within the targets; a saving surely above 0
    assert chosen.ttft.high <= 0.05 and chosen.tpot.high <= 0.05
    assert chosen.saving.low > 0
    # at least the best single static clock's saving, measured the same way
    static = [r for r in res.rounds if r.name == "best static clock"]
    assert static, [r.name for r in res.rounds]
    assert chosen.saving.mean >= static[0].saving.mean
    # the steady phase switches at each phase boundary
    steady = [it for it in res.iterations if it.stage == "steady"]
    assert steady
    assert {it.freq_mhz for it in steady if it.phase == "prefill"} == set(
        chosen.clocks_mhz["prefill"]
    )
    assert all(
        it.freq_mhz is not None and it.freq_mhz < TOP_MHZ
        for it in steady
        if it.phase == "decode" and not it.lead
    )
    # no fallback warning (the one another test's torch.compile in this process may cause
    # is about compiling, not the plan)
    assert not [w for w in caught if "falling back" in str(w.message)]
    doc = json.loads((tmp_path / "generate.json").read_text())
    assert doc["format"] == "opdvfs.tune-generate" and doc["chosen"] == res.chosen
    summary = (tmp_path / "summary.txt").read_text()
    assert "energy per token saved" in summary and "J/token" in summary


@pytest.mark.slow  # ~25 s: the example with varied lengths through the command line
def test_tune_generate_command_handles_lengths_varying_per_request(tmp_path):
    from opdvfs.cli import app

    _example()
    out = tmp_path / "out"
    argv = [
        "tune", "--mode", "generate", "--ttft-target", "0.05", "--tpot-target", "0.05", *SIM,
        "--out", str(out), "--", "python", str(EXAMPLES / "generate_gpt2.py"),
        str(VARY_REQUESTS), "--vary",
    ]  # fmt: skip
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.output
    assert "energy per token saved" in res.output
    doc = json.loads((out / "generate.json").read_text())
    # no plan per length: one per phase and operator count, decode split in two by length
    # only where the two halves of its profiled steps plan other clocks
    phases = [k.split("/")[0] for k in doc["buckets"]]
    check = doc["length_check"]
    assert check["checked"] and phases.count("prefill") == 1
    assert phases.count("decode") == (1 if check["shared"] else 2)
    assert check["shared"] == (check["short_mhz"] == check["long_mhz"])
    lengths = {it["seq_len"] for it in doc["iterations"] if it["phase"] == "prefill"}
    positions = {it["position"] for it in doc["iterations"] if it["phase"] == "decode"}
    assert len(lengths) > 20 and len(positions) > 20
    assert "falling back" not in res.output
    assert doc["chosen"] is not None and doc["met"]
    chosen = doc["rounds"][doc["chosen"]]
    assert chosen["ttft"]["high"] <= 0.05 and chosen["tpot"]["high"] <= 0.05
    assert max(chosen["clocks_mhz"]["decode"]) < TOP_MHZ
    assert not math.isnan(chosen["saving"]["low"]) and chosen["saving"]["low"] > 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--mode", "serve", "--target", "0.05"), "--mode serve: expected train or generate"),
        (("--mode", "generate"), "give --target"),
        (("--mode", "generate", "--target", "0.05", "--actuator", "nvml"), "simulated GPU"),
        (("--mode", "generate", "--ttft-target", "0", "--tpot-target", "0.1"), "--ttft-target"),
    ],
)
def test_bad_generate_options_exit_2_with_one_line(args, needle, tmp_path):
    from opdvfs.cli import app

    argv = ["tune", *args] + ([] if "--actuator" in args else ["--actuator", "sim:a100-like"])
    res = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "o"), "--", "python", "x.py"])
    assert res.exit_code == 2, res.output
    assert needle in res.output
    assert "Traceback" not in res.output


@pytest.mark.slow  # a few requests through the command line
def test_a_loop_too_short_to_profile_exits_2_and_writes_nothing(tmp_path):
    from opdvfs.cli import app

    _example()
    out = tmp_path / "out"
    argv = [
        "tune", "--mode", "generate", "--target", "0.05", *SIM, "--out", str(out),
        "--", "python", str(EXAMPLES / "generate_gpt2.py"), "3",
    ]  # fmt: skip
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2, res.output
    assert "run more requests" in res.output and "nothing was written" in res.output
    assert "Traceback" not in res.output
    assert not out.exists()


@pytest.mark.slow  # 8 requests through HF generate() on the simulated GPU
def test_with_model_only_its_forwards_are_steps():
    import torch

    import opdvfs

    example = _example()
    model = example.tiny_gpt2()
    other = torch.nn.Linear(4, 4)
    with (
        opdvfs.tune(
            0.05, actuator="sim:a100-like", work_scale=400, mode="generate", model=model
        ) as t,
        torch.no_grad(),
    ):
        for _ in range(8):
            other(torch.ones(1, 4))  # another module's forward: not a step
            ids = torch.randint(1, 256, (2, 64))
            model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                min_new_tokens=4, do_sample=False, pad_token_id=0,
            )  # fmt: skip
    steps = t.result.iterations
    assert len(steps) == 8 * 4
    assert [it.phase for it in steps[:4]] == ["prefill", "decode", "decode", "decode"]
    assert {(it.phase, it.batch, it.seq_len) for it in steps} == {
        ("prefill", 2, 64),
        ("decode", 2, 1),
    }
    assert "run more requests" in (t.result.error or "")
