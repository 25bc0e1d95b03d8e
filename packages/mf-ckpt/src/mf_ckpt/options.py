"""Save and load options: the `checkpoint` section of the training YAML, as plain dataclasses.

mf-trainer maps its config onto these (mf-ckpt never imports mf-config). Every field is honoured;
invalid values raise CheckpointError naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .errors import CheckpointError


def _check_types(obj) -> None:
    for f in fields(obj):
        value = getattr(obj, f.name)
        expected = f.type if isinstance(f.type, str) else f.type.__name__
        ok = {
            "bool": isinstance(value, bool),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "str": isinstance(value, str),
            "int | None": value is None or (isinstance(value, int) and not isinstance(value, bool)),
        }.get(expected, True)
        if not ok:
            raise CheckpointError(f"{type(obj).__name__}.{f.name}: expected {expected}, got {value!r}")


@dataclass(frozen=True)
class SaveOptions:
    """Where and how to save.

    save_path                 directory holding `latest_checkpointed_iteration.txt` and `iteration_*`
    enable_save               False: `Saver.save` writes nothing and `should_save` is always False
    save_max                  keep the newest N committed checkpoints (None keeps all)
    save_interleaved_steps    `should_save(step)` is True every this many steps
    no_save_optim             do not write optimizer state (`-opt-` files)
    async_save                snapshot to host memory and write in a background thread
    prefix                    file name prefix: `{prefix}-model-{rank:07d}-{world:07d}.safetensors`
    remove_redundancy         write every replicated chunk exactly once, spread over its replicas
    save_global_layout_cache  reuse the gathered global layout while the structure is unchanged
    fsync                     (extension) fsync files and directories before committing, so a
                              power loss cannot lose a committed checkpoint; a killed process
                              never can
    """

    save_path: str = ""
    enable_save: bool = True
    save_max: int | None = 5
    save_interleaved_steps: int = 1000
    no_save_optim: bool = False
    async_save: bool = False
    prefix: str = "checkpoint"
    remove_redundancy: bool = False
    save_global_layout_cache: bool = True
    fsync: bool = True

    def __post_init__(self) -> None:
        _check_types(self)
        if self.save_max is not None and self.save_max < 1:
            raise CheckpointError(f"SaveOptions.save_max: must be >= 1 (or None to keep all), got {self.save_max}")
        if self.save_interleaved_steps < 1:
            raise CheckpointError(
                f"SaveOptions.save_interleaved_steps: must be >= 1, got {self.save_interleaved_steps}"
            )
        bad = set('/\\\x00') & set(self.prefix)
        if not self.prefix or bad or self.prefix.startswith("."):
            raise CheckpointError(f"SaveOptions.prefix: must be a plain file name part, got {self.prefix!r}")

    def should_save(self, step: int) -> bool:
        """True when `step` (1-based count of finished steps) is a save step."""
        return self.enable_save and step > 0 and step % self.save_interleaved_steps == 0


@dataclass(frozen=True)
class LoadOptions:
    """What to load and how.

    load_path           an mf save directory (uses its latest_checkpointed_iteration.txt), one
                        `iteration_*` directory, a Hugging Face directory, or a directory of
                        plain safetensors (e.g. `mf-ckpt merge` output); empty: nothing to load
    load_balanced       read each needed chunk once across ranks and share it
    no_load_optim       leave optimizer buffers untouched (model weights only)
    load_worker_number  reader threads per rank
    verify_checksums    (extension) check every chunk read against the checksum its metadata
                        records (a chunk read in part is read whole once to be checked); False
                        skips the check. Checkpoints written before checksums load either way
    """

    load_path: str = ""
    load_balanced: bool = False
    no_load_optim: bool = False
    load_worker_number: int = 1
    verify_checksums: bool = True

    def __post_init__(self) -> None:
        _check_types(self)
        if self.load_worker_number < 1:
            raise CheckpointError(f"LoadOptions.load_worker_number: must be >= 1, got {self.load_worker_number}")

    @property
    def enabled(self) -> bool:
        return bool(self.load_path)
