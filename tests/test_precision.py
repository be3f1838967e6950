"""``mixed_precision: auto`` (training/precision.py): the device's declared features through the
one table, each row with its decision and its one-line reason."""

from __future__ import annotations

import pytest
import torch

from attention_seq2seq.training import precision
from attention_seq2seq.training.precision import cpu_name, read_cpuinfo, resolve_mixed_precision
from attention_seq2seq.training.train import CHOICES, TrainConfig, validate_config

XEON_AMX = ("GenuineIntel", "Intel(R) Xeon(R) Processor", "fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile")
EPYC_ZEN4 = ("AuthenticAMD", "AMD EPYC 9B14", "fpu sse2 avx2 avx512f avx512_bf16")
XEON_AVX512_BF16 = ("GenuineIntel", "Intel(R) Xeon(R) Processor", "fpu sse2 avx2 avx512f avx512_bf16")
EPYC_AVX2 = ("AuthenticAMD", "AMD EPYC 7B13", "fpu sse2 avx avx2 fma")


def cpuinfo(vendor: str, name: str, flags: str) -> dict[str, str]:
    return {"vendor_id": vendor, "model name": name, "flags": flags}


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize(
    "cpu, expected, because",
    [
        (XEON_AMX, "bf16", "has AMX (amx_bf16), measured 1.5-2.2x float32 on Intel Xeons with AMX"),
        (EPYC_ZEN4, "bf16", "is an AMD CPU with avx512_bf16, measured 1.3-2.0x float32 on AMD EPYC (Zen 4)"),
        (XEON_AVX512_BF16, "no", "has avx512_bf16 but no AMX, where bf16 measured 0.68x float32 on an Intel Xeon"),
        (EPYC_AVX2, "no", "has no bf16 units (neither amx_bf16 nor avx512_bf16)"),
    ],
)
def test_auto_decides_a_cpu_by_its_flags_and_vendor_with_one_reason_line(cpu, expected, because):
    choice = resolve_mixed_precision(cpuinfo(*cpu))
    assert choice.mixed_precision == expected
    assert choice.reason == f"{'bf16' if expected == 'bf16' else 'float32'}: {cpu[1]} {because}"
    assert "\n" not in choice.reason and choice.to_dict() == {"mixed_precision": expected, "reason": choice.reason}


def test_auto_takes_float32_where_the_table_cannot_tell():
    choice = resolve_mixed_precision({})  # no /proc/cpuinfo: not Linux
    assert choice.mixed_precision == "no" and "cannot be read" in choice.reason


@pytest.mark.parametrize("bf16", [True, False])
def test_auto_on_a_cuda_gpu_follows_its_bf16_support(monkeypatch, bf16):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)
    choice = resolve_mixed_precision(cpuinfo(*EPYC_AVX2))  # the GPU decides, not the CPU
    assert choice.mixed_precision == ("bf16" if bf16 else "no")
    assert ("fp16 needs loss scaling" in choice.reason) is not bf16


def test_cpuinfo_is_read_from_the_first_processor_only(tmp_path):
    text = "".join(
        f"processor\t: {i}\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC {i}\nflags\t\t: fpu avx2{extra}\n\n"
        for i, extra in enumerate(["", " avx512_bf16"])
    )
    (tmp_path / "cpuinfo").write_text(text)
    fields = read_cpuinfo(tmp_path / "cpuinfo")
    assert fields["model name"] == "AMD EPYC 0" and fields["flags"] == "fpu avx2"
    assert cpu_name(fields) == "AMD EPYC 0"
    assert read_cpuinfo(tmp_path / "missing") == {}


def test_auto_reads_this_machine_and_gives_the_same_answer_every_time(monkeypatch):
    calls = []
    monkeypatch.setattr(precision, "read_cpuinfo", lambda: calls.append(1) or cpuinfo(*EPYC_AVX2))
    assert resolve_mixed_precision() == resolve_mixed_precision() and calls == [1, 1]
    assert resolve_mixed_precision().mixed_precision == "no"


def test_train_config_accepts_auto():
    assert "auto" in CHOICES["mixed_precision"]
    validate_config(TrainConfig(max_steps=1, mixed_precision="auto"))
