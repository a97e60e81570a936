"""Context/continuation tokenisation as lm-eval's HFLM does it."""

from prunebench.evaluation.encoding import encode, encode_all, encode_pair, model_input
from prunebench.models.tiny import tiny_tokenizer

TOK = tiny_tokenizer()
BOS = TOK.bos_token_id


def test_bos_follows_the_tokenizer_by_default_and_can_be_forced():
    assert encode(TOK, "Paris", None)[0] == BOS
    assert BOS not in encode(TOK, "Paris", False)
    assert encode(TOK, "<s>Paris", None).count(BOS) == 1  # no second BOS


def test_trailing_context_whitespace_moves_to_the_continuation():
    ctx, cont = encode_pair(TOK, "Answer: ", "Paris")
    assert ctx == TOK.encode("Answer:")
    whole = TOK.encode("Answer: Paris")
    assert cont == whole[len(ctx):]


def test_continuation_is_the_tail_of_the_joint_encoding():
    context, continuation = "The quick brown fox jum", "ps over"
    ctx, cont = encode_pair(TOK, context, continuation)
    whole = TOK.encode(context + continuation)
    assert ctx == TOK.encode(context)
    assert cont == whole[len(ctx):]


def test_left_truncation_drops_the_oldest_tokens_and_never_feeds_the_last():
    ctx, cont = list(range(10)), [10, 11, 12]
    seq, clen = model_input(ctx, cont, max_length=6)
    assert seq == [6, 7, 8, 9, 10, 11] and clen == 3


def test_encoding_many_texts_at_once_gives_each_the_ids_of_its_own_encode():
    texts = ["Paris", "<s>Paris", "The quick brown fox", "", " leading space", "Paris"]
    for add_bos in (None, True, False):
        known = encode_all(TOK, texts, add_bos)
        assert known == {text: encode(TOK, text, add_bos) for text in texts}
