"""The done-means checks of issue 30 for one trained Transformer, on a whole test set.

1. The native export (`export --format native`), loaded with `trust_remote_code=False` in a fresh
   Python process where `attention_seq2seq` cannot be imported (`--python`: a venv with only torch
   and transformers), translates the test set with beam 5; the lines must equal our `generate`'s,
   and its teacher-forced logits on 64 test pairs are compared with ours (max |difference|).
2. The CTranslate2 exports (float32, int8), greedy and beam 5: lines identical to ours and BLEU;
   for float32 beam 5, each differing line explained (`explain_beam_differences`).

    python benchmarks/check_deploy_exports.py RUN CORPUS_SPEC [--split test] [--name NAME] [--python BARE_VENV_PYTHON]

Writes results/deploy_check_<NAME>.json; prints the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.machine import cpu_model, log
from harness.results import RESULTS_DIR

_CHILD = r"""
import importlib.util, json, sys
installed = importlib.util.find_spec("attention_seq2seq") is not None  # False in a bare venv
sys.modules["attention_seq2seq"] = None  # our package must not be needed (nor found)
import torch
torch.set_num_threads(int(sys.argv[4]))
import transformers
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
folder, src_file, out_file, logits_file = sys.argv[1:3] + sys.argv[3:4] + sys.argv[5:6]
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=False).eval()
ours = torch.load(logits_file)
with torch.inference_mode():
    theirs = model(input_ids=ours["input_ids"], attention_mask=ours["attention_mask"],
                   decoder_input_ids=ours["decoder_input_ids"]).logits
keep = ours["decoder_attention_mask"].bool()
logit_diff = (theirs - ours["logits"]).abs()[keep].max().item()
sources = json.load(open(src_file, encoding="utf-8"))
order = sorted(range(len(sources)), key=lambda i: len(sources[i]), reverse=True)  # as our translate()
out = [""] * len(sources)
with torch.inference_mode():
    for k in range(0, len(order), 32):
        batch = order[k : k + 32]
        encoded = tokenizer([sources[i] for i in batch], padding=True, return_tensors="pt")
        generated = model.generate(**encoded, num_beams=5)
        for i, text in zip(batch, tokenizer.batch_decode(generated, skip_special_tokens=True)):
            out[i] = text.strip()
json.dump({"class": type(model).__name__, "module": type(model).__module__, "translations": out,
           "max_abs_logit_difference": logit_diff, "package_installed_in_child": installed,
           "python": sys.executable, "torch": torch.__version__, "transformers": transformers.__version__},
          open(out_file, "w", encoding="utf-8"))
"""


def _save_our_logits(loaded, sources, references, path: Path) -> None:
    """Our teacher-forced logits on some test pairs, with the inputs, for the native process to compare."""
    import torch

    from attention_seq2seq.modeling.losses import shift_tokens_right

    tokenizer, model = loaded.tokenizer, loaded.model
    encoded = tokenizer(sources, text_target=references, padding=True, return_tensors="pt")
    labels = encoded["labels"]
    decoder_input_ids = shift_tokens_right(labels, tokenizer.pad_token_id, model.config.decoder_start_token_id)
    decoder_attention_mask = torch.cat([torch.ones_like(labels[:, :1]), (labels[:, :-1] != tokenizer.pad_token_id)], 1)
    with torch.inference_mode():
        logits = model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"],
                       decoder_input_ids=decoder_input_ids).logits  # fmt: skip
    torch.save({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"],
                "decoder_input_ids": decoder_input_ids, "decoder_attention_mask": decoder_attention_mask.long(),
                "logits": logits}, path)  # fmt: skip


def _normalized_logprob(loaded, sources, hypotheses) -> list[float]:
    """Our model's log p(hypothesis | source) / length (tokens with </s>), teacher-forced: the
    score the beam ranks finished hypotheses by (length_penalty 1.0)."""
    import torch

    from attention_seq2seq.modeling.losses import shift_tokens_right

    tokenizer, model = loaded.tokenizer, loaded.model
    scores = []
    for source, hypothesis in zip(sources, hypotheses):
        encoded = tokenizer([source], text_target=[hypothesis], return_tensors="pt")
        labels = encoded["labels"]
        decoder_input_ids = shift_tokens_right(labels, tokenizer.pad_token_id, model.config.decoder_start_token_id)
        with torch.inference_mode():
            logits = model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"],
                           decoder_input_ids=decoder_input_ids).logits  # fmt: skip
        log_probs = logits.log_softmax(-1).gather(-1, labels[..., None]).squeeze(-1)
        scores.append(float(log_probs.sum() / labels.size(1)))
    return scores


def explain_beam_differences(ours_model, ct2_folder: Path, sources, ours, theirs, differing) -> dict:
    """Why CTranslate2's beam 5 differs from ours on `differing` lines: which hypothesis our model
    scores higher (a search difference, not a model one), and whether CTranslate2 with patience 1
    (stop once 5 hypotheses finished) gives our line instead (the stopping rule)."""
    import attention_seq2seq.translation.ct2 as inference_ct2

    if not differing:
        return {}
    picked = [sources[i] for i in differing]
    ours_scores = _normalized_logprob(ours_model, picked, [ours[i] for i in differing])
    ct2_scores = _normalized_logprob(ours_model, picked, [theirs[i] for i in differing])
    model, tokenizer = inference_ct2.load_ct2(ct2_folder, device="cpu")
    saved, inference_ct2.BEAM_PATIENCE = inference_ct2.BEAM_PATIENCE, 1
    try:
        found = inference_ct2.translate_ct2(model, tokenizer, picked, batch_size=32, num_beams=5)
        patience1 = [hypotheses[0][0] for hypotheses in found]
    finally:
        inference_ct2.BEAM_PATIENCE = saved
    return {
        "lines": len(differing),
        "ours_scores_higher": sum(o > c + 1e-6 for o, c in zip(ours_scores, ct2_scores)),
        "ct2_scores_higher": sum(c > o + 1e-6 for o, c in zip(ours_scores, ct2_scores)),
        "patience1_gives_ours": sum(p == ours[i] for p, i in zip(patience1, differing)),
        "mean_normalized_logprob": {"ours": sum(ours_scores) / len(differing), "ct2": sum(ct2_scores) / len(differing)},
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run")
    parser.add_argument("corpus")
    parser.add_argument("--split", default="test")
    parser.add_argument("--name", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter of the native export's process: a venv with only torch and transformers "
        "(and sentencepiece/tokenizers) shows the export needs nothing of this package",
    )
    args = parser.parse_args(argv)

    import datasets
    import torch

    torch.set_num_threads(args.threads)
    datasets.disable_progress_bars()
    from attention_seq2seq.data import load_corpus
    from attention_seq2seq.hub.export_ct2 import export_ct2
    from attention_seq2seq.hub.export_native import export_native
    from attention_seq2seq.translation.loading import load_for_inference, translate
    from attention_seq2seq.translation.scores import corpus_scores

    dataset = load_corpus(args.corpus)[args.split]
    sources, references = list(dataset["source"]), list(dataset["target"])
    folder = Path(tempfile.mkdtemp(prefix="deploy_check_"))
    export_native(args.run, folder / "native")
    for quantization in ("float32", "int8"):
        export_ct2(args.run, folder / quantization, quantization=quantization)

    (folder / "sources.json").write_text(json.dumps(sources), encoding="utf-8")
    ours_model = load_for_inference(args.run, device="cpu")
    _save_our_logits(ours_model, sources[:64], references[:64], folder / "ours_logits.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    start = time.perf_counter()
    child = subprocess.run(
        [args.python, "-c", _CHILD, str(folder / "native"), str(folder / "sources.json"),
         str(folder / "native.json"), str(args.threads), str(folder / "ours_logits.pt")],
        cwd=folder, env=env, capture_output=True, text=True,
    )  # fmt: skip
    if child.returncode != 0:
        raise SystemExit(child.stderr[-4000:])
    native = json.loads((folder / "native.json").read_text(encoding="utf-8"))
    log(f"native export, fresh process: {time.perf_counter() - start:.0f} s")

    result = {"run": args.run, "corpus": args.corpus, "split": args.split, "sentences": len(sources),
              "host": cpu_model(), "threads": args.threads, "native_class": native["class"],
              "native_module": native["module"],
              "native_max_abs_logit_difference": native["max_abs_logit_difference"],
              "native_process": {k: native[k] for k in ("python", "torch", "transformers",
                                                        "package_installed_in_child")}}  # fmt: skip
    for beams in (5, 1):
        mode = "greedy" if beams == 1 else f"beam{beams}"
        ours = translate(ours_model, sources, batch_size=32, num_beams=beams)
        result[f"ours_{mode}_bleu"] = corpus_scores(ours, references)["bleu"]
        if beams == 5:
            differing = [i for i, (a, b) in enumerate(zip(ours, native["translations"])) if a != b]
            result["native_beam5"] = {"identical": len(sources) - len(differing), "differing_lines": differing,
                                      "bleu": corpus_scores(native["translations"], references)["bleu"]}  # fmt: skip
        for quantization in ("float32", "int8"):
            theirs = translate(load_for_inference(folder / quantization, device="cpu"), sources, batch_size=32,
                               num_beams=beams)  # fmt: skip
            differing = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
            result[f"ct2_{quantization}_{mode}"] = {
                "identical": len(sources) - len(differing), "differing_lines": differing,
                "bleu": corpus_scores(theirs, references)["bleu"],
            }  # fmt: skip
            if quantization == "float32" and beams > 1:
                result[f"ct2_{quantization}_{mode}"]["explained"] = explain_beam_differences(
                    ours_model, folder / quantization, sources, ours, theirs, differing
                )
        log(f"{mode} done")
    shutil.rmtree(folder, ignore_errors=True)  # the temporary exports
    name = args.name or Path(args.run).name
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"deploy_check_{name}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    summary = {k: ({kk: vv for kk, vv in v.items() if kk != "differing_lines"} if isinstance(v, dict) else v)
               for k, v in result.items()}  # fmt: skip
    print(json.dumps(summary, indent=1))
    return result


if __name__ == "__main__":
    main()
