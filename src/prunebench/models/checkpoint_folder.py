"""What a local checkpoint folder (`model.path=FOLDER`) must hold besides config.json, looked at
before any weights are read: safetensors files whose headers safetensors can read and whose tensors
fit in the file, and a tokenizer's vocabulary. A download cut short, or a folder saved without its
tokenizer, then fails validation instead of the load."""

from __future__ import annotations

from pathlib import Path

from prunebench.models.lean import checkpoint_files

PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
# the vocabulary files transformers' tokenizers read, one of which a folder must hold (the fast
# tokenizer's tokenizer.json, else a slow tokenizer's files it converts: SentencePiece's *.model,
# BPE's vocab.json and merges.txt, WordPiece's vocab.txt, tiktoken's, Mistral's tekken.json); a
# by-hand list, as transformers says which files a folder needs only by trying to build the tokenizer
TOKENIZER_FILES = ("tokenizer.json", "*.model", "tokenizer.model*", "vocab.*", "merges.txt", "*.tiktoken",
                   "tekken.json", "*.codes", "dict.txt")


def check_weights(path: str, folder: Path) -> None:
    """safetensors' `safe_open` reads a file's header and refuses one whose tensors end past the
    file's end ("incomplete metadata, file not fully covered"); it maps the file, reading no tensor.
    A pickled checkpoint (pytorch_model.bin) is not opened: unpickling it could run its code."""
    from safetensors import SafetensorError, safe_open

    try:
        files = checkpoint_files(folder)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"model.path={path!r}: {folder / 'model.safetensors.index.json'} is not a shard index "
                         f"(a JSON object with a weight_map; {type(err).__name__}: {err}); download it again") from None
    if files is None:
        if any((folder / name).is_file() for name in PICKLED_WEIGHTS):
            return
        raise ValueError(f"model.path={path!r} holds no weights (model.safetensors, model.safetensors.index.json "
                         f"with its shards, or pytorch_model.bin); it holds {sorted(p.name for p in folder.iterdir())[:8]}")
    for file in files:
        if not file.is_file():
            raise ValueError(f"model.path={path!r}: model.safetensors.index.json names the shard {file.name}, "
                             f"which is not in the folder; download the missing shards")
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except SafetensorError as err:
            raise ValueError(f"model.path={path!r}: {file.name} ({file.stat().st_size} bytes) is cut short or "
                             f"damaged: safetensors cannot read it ({err}); download or export it again") from None


def check_tokenizer(path: str, folder: Path) -> None:
    """The loaders read the tokenizer (a vision-language model's processor) from the same folder."""
    if any(next(folder.glob(pattern), None) for pattern in TOKENIZER_FILES):
        return
    raise ValueError(f"model.path={path!r} holds no tokenizer (none of {list(TOKENIZER_FILES)}), which the "
                     f"model is loaded with; save the base model's there: AutoTokenizer.from_pretrained(BASE)"
                     f".save_pretrained(FOLDER) (AutoProcessor for a vision-language model)")


def check_checkpoint_folder(path: str, trust_remote_code: bool = False) -> None:
    """ValueError naming the folder and what is wrong; nothing to check for a hub id (its files
    arrive when the model loads). A checkpoint with its own code may read a tokenizer of its own
    making, so its folder's tokenizer is not looked for."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return
    check_weights(path, folder)
    if not trust_remote_code:
        check_tokenizer(path, folder)
