"""Train an attention seq2seq model with Accelerate: one command from one CPU to many GPUs.

    python -m attention_seq2seq.training.train --recipe training/recipes/multi30k-transformer-small.yaml
    accelerate launch --multi_gpu --num_processes 8 -m attention_seq2seq.training.train \\
        --recipe training/recipes/multi30k-transformer-small.yaml --mixed_precision bf16
    accelerate launch --multi_gpu --num_processes 2 -m attention_seq2seq.training.train ...  # 2 CPU ranks (gloo)

Every hyperparameter is a field of :class:`TrainConfig` (``train_config.py``); a recipe (YAML or JSON) sets any of
them and ``--field value`` on the command line overrides the recipe (see ``training/config.py``).

How a step works (fairseq's recipe, written with Accelerate's primitives): each rank draws
``gradient_accumulation_steps`` token-budget micro-batches; the number of target tokens of the
whole update is summed over micro-batches and all-reduced over ranks; each micro-batch's
*summed* token loss is divided by that global count and back-propagated (DDP communicates only on
the last one, ``accelerator.no_sync``). The update therefore minimises the mean loss per target
token of the global batch, whatever the split into ranks and micro-batches: 2 × B accumulated is
one batch of 2B, and 2 ranks are one process with twice the batch.

Paths and runs
    Relative paths (the corpus spec's location, ``output_dir``, ``tokenizer_path``) are read from
    the working directory, like any path on a command line; the shipped recipes assume the
    repository root (``../shared/data/...``). Rerun the same command with ``--resume`` to continue
    from the newest checkpoint: the same data order, RNG states and schedule, so the run ends
    with the weights an uninterrupted run would have. Several machines: Accelerate's own options
    (``--num_machines``, ``--machine_rank``, ``--main_process_ip``); ``output_dir`` must then be
    on a shared file system (rank 0 writes the checkpoint, every rank its RNG state).

What a person watches
    A tqdm bar on the main process (loss, learning rate, target tokens/s), TensorBoard under
    ``output_dir/logs`` (``tensorboard --logdir runs/``), one line per validation, and attention
    heat-maps of fixed validation sentences in ``output_dir/plots`` after each validation.

Output folder layout and ``metrics.json``: docs/DESIGN.md, "Training output folder".

The file reads build -> loop -> finalize; the pieces live beside it: ``train_config.py`` (the
hyperparameters), ``build.py`` (accelerator, data, model, optimizer, schedule), ``objectives.py``
(token loss, R-Drop, word dropout), ``checkpoints.py`` (atomic writes, best-k, resume),
``evaluation.py`` (scores, heat-maps, metrics.json), ``schedules.py``; the data side in
``data/pairs.py``.
"""

from __future__ import annotations

import datetime

import dataclasses
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from ..data.pairs import Collate, PairDataset, micro_batches  # noqa: F401  (Collate, PairDataset: public names of this module)
from .averaging import average_checkpoints, load_averaged_weights
from .build import (  # noqa: F401  (re-exported: the trainer's public pieces)
    build_accelerator,
    build_model,
    build_optimizer,
    build_schedule,
    build_subword_resampling,
    build_train_loader,
    load_data,
    logger,
    optimizer_param_groups,
    resolve_precision,
    setup_logging,
)
from ..common.durability import DiskFullError, LockedError, exclusive
from .checkpoints import (
    TrainerState,
    atomic_write,
    drop_lost_best,
    final_weight_sources,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    step_dirs,
    update_best,
)
from ..common.errors import UserError
from .config import RecipeError, dump_recipe, parse_command_line
from .evaluation import evaluate, metrics_test_section, plot_attention, run_provenance, write_run_report
from .file_modes import give_ordinary_modes
from .objectives import optimizer_update, source_word_dropout, symmetric_kl_sum, token_loss_sum  # noqa: F401
from .train_config import CHOICES, TrainConfig, check_paths, validate_config  # noqa: F401


def train(config: TrainConfig) -> Path:
    """Run a whole training (or resume one) and return the output folder.

    The main process holds ``output_dir/.train.lock`` for the whole run: a second training into
    the same folder stops at once with one line naming the first (its pid, host and command).

    Writes ``model/``, ``metrics.json``, ``recipe.yaml``, ``plots/``, ``checkpoints/``, ``best/``
    and ``logs/`` under ``config.output_dir`` (docs/DESIGN.md). Safe to call in-process, several
    times; Accelerate keeps one state per process, so those calls must share ``mixed_precision``.

    Raises:
        RecipeError: invalid hyperparameters, or an ``output_dir``, corpus location or
            ``tokenizer_path`` that cannot serve (the message names the field); raised before
            anything is written.
        FileExistsError: ``output_dir`` holds checkpoints and ``resume`` is off.
        FloatingPointError: the training loss became NaN or infinite (names the first bad update;
            the checkpoints written before it are kept).
        LockedError: another live process trains into ``output_dir``.
        DiskFullError: the disk filled while writing a checkpoint or the final model (names the
            folder and the space it needs; the previous checkpoint is intact, ``--resume`` goes on).
    """
    validate_config(config)
    output_dir = check_paths(config)  # before anything is written: the run folder, the corpus, the tokenizer
    if int(os.environ.get("RANK", "0")) != 0:  # one lock per run, held by its global rank 0
        return _train(config, output_dir)
    made = not output_dir.exists()
    output_dir.mkdir(parents=True, exist_ok=True)
    try:
        with exclusive(output_dir / ".train.lock", f"output folder {output_dir}"):
            return _train(config, output_dir)
    except UserError:
        # A fault only the prepared data shows (no pair fits the length limits, a corpus line
        # that does not pair up) stopped a run this call started: leave no folder behind.
        if made and not (output_dir / "model").exists() and not step_dirs(output_dir / "checkpoints"):
            shutil.rmtree(output_dir, ignore_errors=True)
        raise


def _train(config: TrainConfig, output_dir: Path) -> Path:
    # ==== build ====================================================================================
    ckpt_root, best_root, plots_dir = output_dir / "checkpoints", output_dir / "best", output_dir / "plots"
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    precision = resolve_precision(config)  # None unless mixed_precision is "auto"
    accelerator = build_accelerator(config, output_dir, precision.mixed_precision if precision else None)
    is_main, world, device = accelerator.is_main_process, accelerator.num_processes, accelerator.device
    setup_logging(is_main)
    logger.info("world size %d, device %s, mixed precision %s", world, device, accelerator.mixed_precision)
    if precision is not None:
        logger.info("mixed_precision auto -> %s", precision.reason)
    if step_dirs(ckpt_root) and not config.resume:
        raise FileExistsError(
            f"{ckpt_root} already holds checkpoints: pass --resume to continue the run or choose another output_dir"
        )
    if is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        dump_recipe(config, output_dir / "recipe.yaml")
    provenance = run_provenance(device)  # at the start: the code this session trains with
    set_seed(config.seed)

    data, info, tokenizer = load_data(config, accelerator, output_dir)
    if config.source_word_dropout > 0 and tokenizer.unk_token_id is None:
        raise RecipeError(
            f"source_word_dropout replaces tokens by <unk>, "
            f"but the tokenizer ({config.tokenizer_path}) has no unk_token; "
            "set source_word_dropout: 0"
        )
    train_set = data["train"]  # memory-mapped ids (data/prepared.py); the loader reads a batch's rows
    if "train_text" in data:  # subword resampling rewrites the ids each epoch: Python lists
        train_set = PairDataset(train_set.column("source"), train_set.column("target"))
    # With subword sampling, the sampler and the step count of max_epochs start from the best
    # segmentation (deterministic, so a resumed run computes the same schedule); each epoch's
    # batches then follow that epoch's sampled lengths (before_epoch below).
    resample_segmentations = build_subword_resampling(config, data.get("train_text"), train_set, tokenizer, accelerator)
    sampler, loader = build_train_loader(config, train_set, tokenizer, accelerator)
    state = TrainerState(batches_per_epoch=len(sampler))
    updates_per_epoch = max(1, state.batches_per_epoch // config.gradient_accumulation_steps)
    limits = [config.max_steps] if config.max_steps is not None else []
    if config.max_epochs is not None:
        limits.append(math.ceil(config.max_epochs * updates_per_epoch))
    total_steps = min(limits) if limits else None

    set_seed(config.seed)  # the same initial weights whatever the data loading consumed
    model = build_model(config, tokenizer)
    set_seed(config.seed, device_specific=True)  # dropout: a different stream on each rank
    optimizer = build_optimizer(config, model, accelerator)
    # Stepped once per update by optimizer_update, not by Accelerate (whose wrapper steps it once
    # per process); checkpointed with the loop's own state (training/checkpoints.py).
    schedule = build_schedule(config, optimizer, total_steps)
    model, optimizer = accelerator.prepare(model, optimizer)
    unwrapped = accelerator.unwrap_model(model)
    checkpointed = {"trainer": state, "schedule": schedule}

    if config.resume and step_dirs(ckpt_root):
        last = step_dirs(ckpt_root)[-1]
        saved = load_checkpoint(accelerator, last)
        state.load_state_dict(saved["trainer"])
        clock_saved = schedule.load_state_dict(saved["schedule"])
        logger.info("resumed from %s (update %d, epoch %.2f)", last, state.step, state.epochs)
        if not clock_saved:  # a run switched to linear_time on --resume
            logger.info(
                "schedule linear_time: %s has no time-budget state; the decay starts at update %d", last, state.step
            )
        if is_main:  # best/ folders written after that checkpoint belong to the lost future
            drop_lost_best(best_root, state)
            prune_checkpoints(ckpt_root, config.keep_last_checkpoints)

    if config.log_with != "none":
        flat = {k: (json.dumps(v) if isinstance(v, dict) else v) for k, v in dataclasses.asdict(config).items()}
        accelerator.init_trackers("logs", config=flat)
    num_params = sum(p.numel() for p in unwrapped.parameters())
    logger.info(
        "%s: %.2fM parameters, %d training pairs, %d micro-batches per epoch per rank",
        type(unwrapped).__name__,
        num_params / 1e6,
        len(train_set),
        state.batches_per_epoch,
    )
    if total_steps is not None:
        left = total_steps - state.step
        logger.info("%d updates to do (%.2f epochs)", left, left / updates_per_epoch)
    higher_is_better = config.early_stopping_metric != "loss"
    plot_sources = data["validation"]["source"][: config.num_plot_sentences]  # fixed sentences
    dump = None
    if config.debug_dump_batches:
        (output_dir / "debug").mkdir(parents=True, exist_ok=True)
        dump = open(output_dir / "debug" / f"batches_rank{accelerator.process_index}.jsonl", "a")

    def validate_and_keep() -> bool:
        """Validate, log, keep the best weights; returns True when early stopping says stop."""
        result = evaluate(
            unwrapped,
            data["validation"],
            tokenizer,
            config,
            accelerator,
            config.eval_num_beams,
            config.max_eval_samples,
            info.target_lang,
        )
        record = {"step": state.step, **{k: result[k] for k in ("loss", "perplexity", "bleu", "chrf")}}
        state.validation.append(record)
        score = record[config.early_stopping_metric]
        previous = [v[config.early_stopping_metric] for v in state.validation[:-1]]
        improved = not previous or (score > max(previous) if higher_is_better else score < min(previous))
        state.bad_validations = 0 if improved else state.bad_validations + 1
        schedule.observe_validation(score)
        update_best(accelerator, model, state, best_root, score, higher_is_better, config.keep_best_k)
        if is_main:
            accelerator.log({f"valid/{k}": v for k, v in record.items() if k != "step"}, step=state.step)
            tqdm.write(
                f"validation @ {state.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in record.items() if k != "step")
            )
            if config.num_plot_sentences:
                plot_attention(
                    unwrapped, tokenizer, plot_sources, plots_dir, f"attention_val_step{state.step}", config, device
                )
        accelerator.wait_for_everyone()
        patience = config.early_stopping_patience
        return patience is not None and state.bad_validations >= patience

    # ==== loop =====================================================================================
    model.train()
    before_epoch = None
    if resample_segmentations is not None:

        def before_epoch(epoch: int) -> None:
            if resample_segmentations(epoch):
                sampler.set_lengths(train_set.lengths())
                state.batches_per_epoch = len(sampler.global_batches(epoch)) // world

    special_source_ids = tuple(i for i in (tokenizer.bos_token_id, tokenizer.eos_token_id) if i is not None)
    stream = micro_batches(loader, sampler, state, device, before_epoch)
    loss_acc = torch.zeros((), device=device)  # summed smoothed loss since the last log (this rank)
    tokens_acc = torch.zeros((), device=device)  # target tokens since the last log (all ranks)
    first_bad = torch.full((), -1, dtype=torch.long, device=device)  # first update with a non-finite loss
    last_log_time = session_start = time.perf_counter()
    earlier_sessions_s = state.wall_time_s
    budget_s = 60 * config.max_time_minutes if config.max_time_minutes is not None else None
    schedule.observe_time(
        earlier_sessions_s, state.step
    )  # warm-up 0 (or a resume after it): the decay starts now at the latest
    # A terminal (or the main job relaying one: ATTENTION_SEQ2SEQ_PROGRESS=live) redraws the bar
    # twice a second; a log file gets a line per 30 s.
    live = sys.stderr.isatty() or os.environ.get("ATTENTION_SEQ2SEQ_PROGRESS") == "live"
    progress = tqdm(
        total=total_steps,
        initial=state.step,
        disable=not is_main,
        desc="train",
        unit="upd",
        dynamic_ncols=True,
        mininterval=0.5 if live else 30.0,
    )
    stop_reason = None
    first_step = state.step
    pace_step = first_step + max(1, min(200, (total_steps - first_step) // 10)) if total_steps is not None else None
    while stop_reason is None and (total_steps is None or state.step < total_steps):
        # One optimizer update: draw the micro-batches first, to know the global token count.
        micro = [next(stream) for _ in range(config.gradient_accumulation_steps)]
        for i, mb in enumerate(micro):
            ids = mb.pop("id")
            mb["input_ids"] = source_word_dropout(
                mb["input_ids"],
                mb["attention_mask"],
                config.source_word_dropout,
                tokenizer.unk_token_id,
                keep_ids=special_source_ids,
            )  # p = 0: unchanged
            if dump is not None:
                dump.write(json.dumps({"step": state.step, "micro": i, "ids": ids.tolist()}) + "\n")
        update_loss, num_tokens = optimizer_update(
            accelerator,
            model,
            optimizer,
            schedule,
            micro,
            config.label_smoothing,
            config.max_grad_norm,
            config.rdrop_alpha,
        )
        first_bad = torch.where((first_bad < 0) & ~torch.isfinite(update_loss), state.step + 1, first_bad)
        state.step += 1
        loss_acc += update_loss
        tokens_acc += num_tokens
        progress.update(1)
        if is_main and total_steps is not None and state.step == pace_step:
            # The estimate made before training timed a synthetic step; this one is the real pace.
            pace = (state.step - first_step) / max(1e-9, time.perf_counter() - session_start)
            tqdm.write(
                f"after {state.step - first_step} updates: {pace:.2f} updates/s here, so the remaining "
                f"{total_steps - state.step} take about {(total_steps - state.step) / pace / 60:.1f} min"
            )

        # ---- logging (the only per-interval host sync), NaN check and time budget -------------
        evaluating = state.step % config.eval_every == 0 or state.step == total_steps
        saving = state.step % config.save_every == 0 or state.step == total_steps
        # One process reads the clock after every update (no host sync needed); ranks of a
        # distributed run agree on it at the log interval, where they synchronise anyway.
        elapsed = None  # the training time all ranks agree on, where this update read it
        over_budget = False
        if world == 1 and budget_s is not None:
            elapsed = earlier_sessions_s + time.perf_counter() - session_start
            over_budget = elapsed > budget_s
        # Several ranks agree on the clock at a log, so linear_time forces one at the end of warm-up.
        warmup_end = schedule.reads_clock and world > 1 and state.step == config.warmup_steps
        if state.step % config.log_every == 0 or evaluating or saving or over_budget or warmup_end:
            stats = torch.stack([loss_acc, tokens_acc / world, first_bad.float()])
            stats = accelerator.gather(stats[None]) if world > 1 else stats[None]
            loss_sum_all, tokens_all = stats[:, 0].sum().item(), stats[:, 1].sum().item()
            bad = [int(b) for b in stats[:, 2].tolist() if b >= 0]
            if bad:
                kept = step_dirs(ckpt_root)
                raise FloatingPointError(
                    f"training loss is not finite at update {min(bad)}; "
                    + (
                        f"the last good checkpoint is kept in {kept[-1]} (--resume continues from it)"
                        if kept
                        else f"no checkpoint was written before it (the first comes at update {config.save_every})"
                    )
                    + "; a lower learning_rate or max_grad_norm usually keeps it finite"
                )
            now = time.perf_counter()
            state.target_tokens += int(tokens_all)
            state.train_time_s += now - last_log_time
            state.wall_time_s = earlier_sessions_s + now - session_start
            last_loss = loss_sum_all / max(1.0, tokens_all)  # mean smoothed loss per target token
            state.train_loss.append([state.step, last_loss])
            logs = {
                "train/loss": last_loss,
                "train/lr": schedule.get_last_lr()[0],
                "train/target_tokens_per_s": tokens_all / max(1e-9, now - last_log_time),
                "train/epoch": state.epochs,
            }
            if is_main:
                progress.set_postfix(
                    loss=f"{last_loss:.3f}",
                    lr=f"{logs['train/lr']:.2e}",
                    tok_s=f"{logs['train/target_tokens_per_s']:.0f}",
                )
                accelerator.log(logs, step=state.step)
            loss_acc.zero_()
            tokens_acc.zero_()
            last_log_time = now
            if budget_s is not None:
                # Every rank must stop at the same update, and use the same learning rate: the
                # slowest rank's clock decides for all.
                slowest = state.wall_time_s
                if world > 1:
                    elapsed = slowest = (
                        accelerator.gather(torch.tensor([slowest], dtype=torch.float64, device=device)).max().item()
                    )
                if slowest > budget_s:  # over budget: all ranks stop at this same update
                    stop_reason = "max_time_minutes"
                    evaluating = saving = True
        if elapsed is not None:
            schedule.observe_time(elapsed, state.step)
        if evaluating and validate_and_keep():
            stop_reason = "early_stopping"
            saving = True
        if saving:
            save_checkpoint(accelerator, ckpt_root, state.step, config.keep_last_checkpoints, checkpointed)
        if evaluating or saving:
            last_log_time = time.perf_counter()  # tokens/s counts update time only
            state.wall_time_s = earlier_sessions_s + last_log_time - session_start
    progress.close()
    if dump is not None:
        dump.close()
        # Each rank's own weights after the last update: the tests check that DDP kept them equal.
        from safetensors.torch import save_file

        weights_file = output_dir / "debug" / f"weights_rank{accelerator.process_index}.safetensors"
        save_file(
            {k: v.detach().cpu().clone().contiguous() for k, v in unwrapped.state_dict().items()}, str(weights_file)
        )
        give_ordinary_modes(weights_file)
    stop_reason = stop_reason or "max_steps/max_epochs"
    logger.info("training stopped (%s) after %d updates, %.2f epochs", stop_reason, state.step, state.epochs)

    # ==== finalize =================================================================================
    # ---- final model: average / best / last weights
    if [p.name for p in step_dirs(ckpt_root)[-1:]] != [f"step_{state.step}"]:
        save_checkpoint(accelerator, ckpt_root, state.step, config.keep_last_checkpoints, checkpointed)
    sources, final_desc = final_weight_sources(
        state, ckpt_root, best_root, config.average_best_k, config.average_last_k, config.early_stopping_metric
    )
    load_averaged_weights(unwrapped, average_checkpoints(sources))
    logger.info("final model: %s", final_desc)

    def write_model(folder: Path) -> None:
        if is_main:
            unwrapped.save_pretrained(folder)
            tokenizer.save_pretrained(folder)

    # model/ is whole or absent
    atomic_write(accelerator, output_dir / "model", write_model, kept="the checkpoints are intact: --resume writes it")

    # ---- test set, the card's heat-map and metrics.json
    # Scored as users will load the saved model: float32, without the mixed-precision autocast
    # that Accelerate wrapped around forward for training (bf16 test scores differed by ~0.1 BLEU).
    unwrapped = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    n_bootstrap = config.test_bootstrap or 1
    test = evaluate(
        unwrapped,
        data["test"],
        tokenizer,
        config,
        accelerator,
        config.test_num_beams,
        config.max_test_samples,
        info.target_lang,
        n_bootstrap,
    )
    greedy = None
    if config.test_greedy and config.test_num_beams != 1:
        greedy = evaluate(
            unwrapped,
            data["test"],
            tokenizer,
            config,
            accelerator,
            1,
            config.max_test_samples,
            info.target_lang,
            n_bootstrap,
        )
    if is_main:
        plot_attention(unwrapped, tokenizer, data["test"]["source"][:1], plots_dir, "attention_test", config, device)
        n_test = (
            len(data["test"]) if config.max_test_samples is None else min(config.max_test_samples, len(data["test"]))
        )
        metrics = {
            "model_family": unwrapped.config.model_type,
            "corpus": {k: v for k, v in info.to_dict().items() if k not in ("counts", "extra")},
            "train": {
                "steps": state.step,
                "epochs": round(state.epochs, 4),
                "wall_time_s": round(state.wall_time_s, 2),
                "train_time_s": round(state.train_time_s, 2),
                "target_tokens": state.target_tokens,
                "target_tokens_per_s": round(state.target_tokens / max(1e-9, state.train_time_s), 2),
                "final_train_loss": state.train_loss[-1][1] if state.train_loss else None,
                "loss_history": state.train_loss,
                "world_size": world,
                "num_threads": torch.get_num_threads(),  # torch intra-op threads of each process
                "mixed_precision": accelerator.mixed_precision,
                **({"mixed_precision_auto": precision.to_dict()} if precision is not None else {}),
                "stopped_by": stop_reason,
                "final_model": final_desc,
                "num_parameters": num_params,
            },
            "validation": state.validation,
            "test": metrics_test_section(config, n_test, test, greedy),
            "run": {**provenance, "finished_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")},
        }
        write_run_report(output_dir, metrics, test, greedy, config.test_num_beams, logger)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return output_dir


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    """Command-line entry: ``--recipe FILE`` plus ``--field value`` overrides (``--help`` lists them).

    A fault prints one line, ``error: <message>`` (``<prog>: error: <message>`` when ``prog`` is
    given: ``attention-seq2seq train`` passes its name) and exits with status 2 (3: a lost rank).
    """
    prefix = f"{prog}: error: " if prog else "error: "
    try:
        config = parse_command_line(TrainConfig, argv, prog=prog or "python -m attention_seq2seq.training.train")
        validate_config(config)
    except RecipeError as err:
        print(f"{prefix}{err}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        train(config)
    except (UserError, FileExistsError, LockedError, DiskFullError, FloatingPointError) as err:
        if os.environ.get("ATTENTION_SEQ2SEQ_DEBUG"):
            raise
        tqdm.write(f"{prefix}{str(err).splitlines()[0]}", file=sys.stderr)  # on a line of its own, below the bar
        raise SystemExit(2) from None
    except RuntimeError as err:
        lost = lost_rank_message(err, config.ddp_timeout)
        if lost is None or os.environ.get("ATTENTION_SEQ2SEQ_DEBUG"):
            raise
        tqdm.write(f"{prefix}{lost}", file=sys.stderr)
        raise SystemExit(3) from None


_PEER_GONE = ("connection reset by peer", "connection closed by peer", "broken pipe", "socket closed")
_WAIT_EXPIRED = ("timed out", "timeout")


def lost_rank_message(err: BaseException, ddp_timeout: int | None = None) -> str | None:
    """One line for a collective that failed because another rank is gone: it died (gloo's or
    NCCL's "Connection reset/closed by peer", noticed at once) or did not answer for
    ``ddp_timeout`` seconds (a hung process, a stopped or unreachable machine); None for any
    other error, and always for a single process."""
    text = str(err).lower()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    rank, world = os.environ.get("RANK", "?"), os.environ.get("WORLD_SIZE")
    if any(p in text for p in _PEER_GONE):
        what = "lost contact with another rank, which stopped"
    elif any(p in text for p in _WAIT_EXPIRED):
        waited = f"{ddp_timeout} s (ddp_timeout)" if ddp_timeout is not None else "the collective timeout"
        what = f"waited {waited} for another rank, which did not answer (hung, stopped or unreachable)"
    else:
        return None
    return (
        f"rank {rank} of {world} {what} (the launcher's summary names it and its exit code); the checkpoints "
        f"written so far are whole: start the same launch with --resume to continue"
    )


if __name__ == "__main__":
    main()
