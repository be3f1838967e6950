"""``mixed_precision: auto``: bf16 or float32 from what the device declares, by one table.

A CPU runs bf16 autocast fast only where it has bf16 matrix units, and not every CPU that has
them gains. The table (docs/training.md shows each row with the measurements behind it;
benchmarks/bench_precision.py measures a host):

- a CUDA GPU: bf16 where ``torch.cuda.is_bf16_supported()``, else float32 (fp16 needs loss
  scaling: ask for it by name);
- a CPU with ``amx_bf16`` (AMX): bf16 (Intel Xeons with AMX: 1.5-2.2x float32);
- an AMD CPU with ``avx512_bf16``: bf16 (AMD EPYC, Zen 4: 1.3-2.0x float32);
- an Intel CPU with ``avx512_bf16`` but no AMX: float32 (a 2-core Xeon: 0.68x, slower);
- anything else (AVX2 only, another architecture): float32 (no bf16 units: autocast emulates bf16).

The flags and vendor come from ``/proc/cpuinfo``; where it cannot be read the table cannot tell,
and float32 is the safe answer. So the same recipe on the same kind of machine always trains the
same model, busy or not. Either choice trains the same model up to rounding (float32 weights and
optimizer state; autocast lowers only the matrix multiplies); only the time differs.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch


@dataclass
class PrecisionChoice:
    """What ``auto`` decided (``"bf16"`` or ``"no"``) and the one-line reason (logged, and kept
    in metrics.json as ``train.mixed_precision_auto``)."""

    mixed_precision: str
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def read_cpuinfo(path: str | Path = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's ``field: value`` lines of ``/proc/cpuinfo`` (``{}`` where it cannot
    be read: not Linux)."""
    fields: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():  # the first processor ends at the first blank line
                    break
                name, _, value = line.partition(":")
                fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_name(cpuinfo: dict[str, str] | None = None) -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    cpuinfo = read_cpuinfo() if cpuinfo is None else cpuinfo
    return cpuinfo.get("model name") or platform.processor() or platform.machine()


def cpu_rule(cpuinfo: dict[str, str]) -> PrecisionChoice:
    """The table's CPU rows for one ``/proc/cpuinfo`` (:func:`read_cpuinfo`)."""
    vendor, flags = cpuinfo.get("vendor_id", ""), set(cpuinfo.get("flags", "").split())
    name = cpuinfo.get("model name") or vendor or "this CPU"
    if not flags:
        return PrecisionChoice("no", "float32: the CPU's flags cannot be read (no /proc/cpuinfo)")
    if "amx_bf16" in flags:
        choice, why = "bf16", "has AMX (amx_bf16), measured 1.5-2.2x float32 on Intel Xeons with AMX"
    elif "avx512_bf16" in flags and vendor == "AuthenticAMD":
        choice, why = "bf16", "is an AMD CPU with avx512_bf16, measured 1.3-2.0x float32 on AMD EPYC (Zen 4)"
    elif "avx512_bf16" in flags:
        choice, why = "no", "has avx512_bf16 but no AMX, where bf16 measured 0.68x float32 on an Intel Xeon"
    else:
        choice, why = "no", "has no bf16 units (neither amx_bf16 nor avx512_bf16)"
    return PrecisionChoice(choice, f"{'bf16' if choice == 'bf16' else 'float32'}: {name} {why}")


def resolve_mixed_precision(cpuinfo: dict[str, str] | None = None) -> PrecisionChoice:
    """Decide ``auto`` for this machine by the module's table: a CUDA GPU by its bf16 support,
    else the CPU by its flags and vendor (``cpuinfo``: :func:`read_cpuinfo` unless given)."""
    if torch.cuda.is_available():
        if torch.cuda.is_bf16_supported():
            return PrecisionChoice("bf16", "bf16: a CUDA GPU that supports bf16")
        return PrecisionChoice(
            "no", "float32: a CUDA GPU without bf16 (fp16 needs loss scaling: pass --mixed_precision fp16 for it)"
        )
    return cpu_rule(read_cpuinfo() if cpuinfo is None else cpuinfo)
