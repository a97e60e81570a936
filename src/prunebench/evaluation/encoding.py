"""Context/continuation tokenisation exactly as lm-eval's HFLM does it, and the BOS a window of
tokens starts with."""

from __future__ import annotations

from collections.abc import Iterable


def prefix_token(tokenizer) -> int | None:
    """The token a sequence starts with: BOS, else EOS."""
    return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id


def prefix_text(tokenizer) -> str | None:
    prefix = prefix_token(tokenizer)
    return None if prefix is None else tokenizer.decode(prefix)


def special_tokens(text: str, add_bos: bool | None, prefix: str | None) -> dict:
    """The `add_special_tokens` argument of a text's encode: `add_bos=None` delegates BOS to the
    tokenizer's default (lm-eval >= 0.4.9.2), true/false forces it; either way a string that already
    starts with the prefix token's text (`prefix_text`) gets no second one, as lm-eval's tok_encode
    checks."""
    kwargs = {} if add_bos is None else {"add_special_tokens": add_bos}
    if prefix is not None and text.startswith(prefix):
        kwargs["add_special_tokens"] = False
    return kwargs


def encode(tokenizer, text: str, add_bos: bool | None, known: dict[str, list[int]] | None = None) -> list[int]:
    """`known`: texts already encoded with this tokenizer and `add_bos` (`encode_all`)."""
    if known is not None and text in known:
        return known[text]
    return tokenizer.encode(text, **special_tokens(text, add_bos, prefix_text(tokenizer)))


def encode_all(tokenizer, texts: Iterable[str], add_bos: bool | None) -> dict[str, list[int]]:
    """Each distinct text's `encode`, in one tokenizer call per kind of arguments: a fast tokenizer's
    batch gives each text the ids its own call gives (its single encode is a batch of one), without a
    Python round trip per text and on the Rust side's threads; a task's choices share their context,
    which is encoded once."""
    prefix, kinds = prefix_text(tokenizer), {}
    for text in dict.fromkeys(texts):
        kinds.setdefault(tuple(special_tokens(text, add_bos, prefix).items()), []).append(text)
    known = {}
    for kwargs, batch in kinds.items():
        ids = tokenizer(batch, **dict(kwargs), return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        known.update(zip(batch, ids))
    return known


def pair_texts(context: str, continuation: str) -> tuple[str, str]:
    """The texts a (non-empty) context and its continuation are encoded as: the context, and the
    whole, once the context's trailing whitespace has moved to the continuation."""
    n = len(context) - len(context.rstrip())
    return (context[:-n], context + continuation) if n else (context, context + continuation)


def encode_pair(tokenizer, context: str, continuation: str, add_bos: bool | None = None,
                known: dict[str, list[int]] | None = None) -> tuple[list[int], list[int]]:
    """Trailing whitespace of the context moves to the continuation; the continuation's tokens are
    whatever follows the context's own tokens in the joint tokenisation (not a separate encode)."""
    if not context:
        prefix = prefix_token(tokenizer)
        cont = tokenizer.encode(continuation, add_special_tokens=False)
        return ([prefix], cont[1:]) if cont and cont[0] == prefix else ([prefix], cont)
    context, whole = pair_texts(context, continuation)
    ctx = encode(tokenizer, context, add_bos, known)
    return ctx, encode(tokenizer, whole, add_bos, known)[len(ctx):]


def rolling_windows(tokenizer, text: str, max_length: int, add_bos: bool | None = None,
                    known: dict[str, list[int]] | None = None) -> list[tuple[list[int], list[int]]]:
    """HFLM's loglikelihood_rolling: the text's tokens (its BOS rule) cut by lm-eval's own
    get_rolling_token_windows into disjoint (context, continuation) windows of max_length, the
    first predicted from the prefix token (BOS, else EOS)."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    windows = get_rolling_token_windows(token_list=encode(tokenizer, text, add_bos, known), prefix_token=prefix_token(tokenizer),
                                        max_seq_len=max_length, context_len=1)
    return [make_disjoint_window(window) for window in windows]


def model_input(ctx: list[int], cont: list[int], max_length: int) -> tuple[list[int], int]:
    """Left-truncated input (the last continuation token is never fed) and how many of its last
    positions predict continuation tokens (all of them, unless the continuation alone overflows)."""
    full = (ctx + cont)[-(max_length + 1):][:-1]
    return full, min(len(cont), len(full))


def window_prefix(tokenizer, add_bos: bool | None = None) -> list[int]:
    """The token each window starts with: BOS when the tokenizer adds one by default (Llama,
    Gemma; lm-eval's rule for `add_bos=None`) or when forced, else nothing.

    Gemma's outputs without a leading BOS are far from its trained distribution, so windows cut
    from the middle of a stream get one too; a window's first text token is then predicted from it."""
    bos = tokenizer.bos_token_id
    if add_bos is False or bos is None:
        return []
    if add_bos is None and tokenizer.encode("a")[:1] != [bos]:
        return []
    return [bos]
