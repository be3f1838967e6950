"""Exports written before the modeling redesign (tests/fixtures/legacy_exports, by main 796bb1c with
make_legacy_exports.py there) still load, with today's classes and as remote code, and give the
outputs they gave then; their state-dict keys are today's (so training checkpoints resume)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attention_seq2seq import RNNSeq2SeqForConditionalGeneration, TransformerSeq2SeqForConditionalGeneration
from helpers import float32_rounding

LEGACY = Path(__file__).parent / "fixtures" / "legacy_exports"
FAMILIES = {
    "transformer_seq2seq": TransformerSeq2SeqForConditionalGeneration,
    "rnn_seq2seq": RNNSeq2SeqForConditionalGeneration,
}


def _outputs(model, expected) -> dict:
    model.train()
    loss = model(
        input_ids=expected["input_ids"], attention_mask=expected["attention_mask"], labels=expected["labels"]
    ).loss
    model.eval()
    with torch.no_grad():
        logits = model(
            input_ids=expected["input_ids"],
            attention_mask=expected["attention_mask"],
            decoder_input_ids=expected["decoder_input_ids"],
        ).logits
        kwargs = dict(attention_mask=expected["attention_mask"], max_new_tokens=6)
        greedy = model.generate(expected["input_ids"], num_beams=1, **kwargs)
        beam = model.generate(expected["input_ids"], num_beams=3, **kwargs)
    return dict(loss=loss.detach(), logits=logits, greedy=greedy, beam=beam)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_legacy_export_loads_into_todays_classes_with_the_same_outputs(family, fast):
    folder = LEGACY / family
    expected = torch.load(folder / "expected.pt")
    model = FAMILIES[family].from_pretrained(folder, use_cpu_fast_paths=fast)
    assert sorted(model.state_dict()) == expected["state_dict_keys"]
    got = _outputs(model, expected)
    # The export's time ran lm_head through oneDNN's prepacked GEMM (fast paths on), removed since
    # (issue 39), on another host: today's kernels add the same products in their own order in each
    # layer of the encoder and the decoder (helpers.float32_rounding; measured 1.2e-6 at logits ~3).
    # The loss, a mean of log-softmaxes, moves by at most twice the largest logit difference.
    config = model.config
    width = getattr(config, "d_model", None) or config.hidden_size
    tolerance = float32_rounding(expected["logits"], width, config.encoder_layers + config.decoder_layers)
    torch.testing.assert_close(got["logits"], expected["logits"], rtol=0, atol=tolerance)
    torch.testing.assert_close(got["loss"], expected["loss"], rtol=0, atol=2 * tolerance)
    assert got["greedy"].tolist() == expected["greedy"].tolist()
    assert got["beam"].tolist() == expected["beam"].tolist()


_REMOTE_CODE_CHILD = r"""
import json, sys
sys.modules["attention_seq2seq"] = None  # the package must not be needed (nor found) here
import torch
from transformers import AutoModelForSeq2SeqLM

result = {}
for folder in sys.argv[1:]:
    expected = torch.load(sys.argv[1] + "/expected.pt")
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        logits = model(input_ids=expected["input_ids"], attention_mask=expected["attention_mask"],
                       decoder_input_ids=expected["decoder_input_ids"]).logits
    result[folder] = {"module": type(model).__module__, "max_diff": (logits - expected["logits"]).abs().max().item()}
print(json.dumps(result))
"""


@pytest.mark.slow  # two fresh interpreters loading remote code
@pytest.mark.parametrize("family", FAMILIES)
def test_legacy_export_as_remote_code_and_its_resave_with_todays_code_give_the_same_logits(family, tmp_path):
    """The legacy folder's own shipped code, and the folder today's code writes for the same
    weights (register_for_auto_class + save_pretrained: the flattened modeling files with
    cpu_fast_paths.py and losses.py beside them), both load with trust_remote_code=True where the
    package cannot be imported, and give the logits of the export's time."""
    legacy = LEGACY / family
    model_cls = FAMILIES[family]
    model = model_cls.from_pretrained(legacy)
    model_cls.register_for_auto_class("AutoModelForSeq2SeqLM")
    try:
        model.save_pretrained(tmp_path / "resaved")
    finally:
        del model_cls._auto_class  # the class is shared with the other tests
    resaved = tmp_path / "resaved"
    shipped = {p.name for p in resaved.glob("*.py")}
    assert {"cpu_fast_paths.py", "losses.py", f"modeling_{family}.py"} <= shipped
    assert not {"fast_inference.py", "fast_dropout.py"} & shipped

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules_cache")}
    env.pop("PYTHONPATH", None)
    completed = subprocess.run(
        [sys.executable, "-c", _REMOTE_CODE_CHILD, str(legacy), str(resaved)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    child = json.loads(completed.stdout.strip().splitlines()[-1])
    for folder in (legacy, resaved):
        assert child[str(folder)]["module"].startswith("transformers_modules")
        assert child[str(folder)]["max_diff"] <= 1e-6, folder


@pytest.mark.parametrize("family", FAMILIES)
def test_parameters_come_in_the_legacy_order_so_optimizer_states_of_old_checkpoints_still_apply(family, tmp_path):
    """An Accelerate checkpoint's optimizer state lists parameters by position: today's classes
    must register them in the order the legacy code did (the legacy classes are imported from the
    export's flattened files)."""
    import importlib
    import shutil

    package = tmp_path / f"legacy_{family}"
    shutil.copytree(LEGACY / family, package, ignore=shutil.ignore_patterns("*.pt", "*.safetensors", "*.json"))
    (package / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    try:
        legacy = importlib.import_module(f"legacy_{family}.modeling_{family}")
    finally:
        sys.path.remove(str(tmp_path))
    today = FAMILIES[family].from_pretrained(LEGACY / family)
    old = getattr(legacy, today.__class__.__name__).from_pretrained(LEGACY / family)
    assert [name for name, _ in today.named_parameters()] == [name for name, _ in old.named_parameters()]
    assert list(today.state_dict()) == list(old.state_dict())
