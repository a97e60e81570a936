"""Recovery on chat conversations: a .jsonl (or .json list) of `{"messages": [{"role", "content"}, ...]}`
records, the format chat fine-tuning sets are shipped in (UltraChat, OpenAssistant exports, an
OpenAI fine-tuning file). Each conversation is written in a chat template and the loss is taken on
the assistant's turns only, as supervised fine-tuning of a chat model does: the user's words are
what the model reads, not what it should learn to say."""

from __future__ import annotations

from prunebench.corpora import data_id
from prunebench.recovery.data import IGNORED, RecoveryData, read_records

ROLES = ("system", "user", "assistant")
SCHEMA = '{"messages": [{"role": ..., "content": ...}, ...]}'


class ChatData(RecoveryData):
    """`recovery.path`: the conversations. `chat_template`: a Jinja chat template (null: the
    tokenizer's own; a tokenizer without one is refused once it has loaded)."""

    name = "chat"

    def __init__(self, options: dict, data_dir: str | None = None, task=None, chat_template: str | None = None):
        super().__init__(options, data_dir, task)
        if not options.get("path"):
            raise ValueError(f"recovery.data=chat needs recovery.path=FILE (JSONL of {SCHEMA} records)")
        self.chat_template = chat_template

    @property
    def records(self) -> bool:
        return True

    def data_ids(self) -> set[str]:
        return {data_id(str(self.path))}

    def conversations(self) -> list[list[dict]]:
        """The records' messages; ValueError naming the first record that is not a conversation with
        an assistant turn."""
        records = read_records(self.path, SCHEMA)
        for number, record in enumerate(records, 1):
            messages = record.get("messages") if isinstance(record, dict) else None
            if not isinstance(messages, list) or not all(
                    isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in messages):
                raise ValueError(f"recovery.path={str(self.path)!r} record {number} is not {SCHEMA} with roles "
                                 f"{list(ROLES)} and string contents")
            if not any(m["role"] == "assistant" for m in messages):
                raise ValueError(f"recovery.path={str(self.path)!r} record {number} has no assistant turn: nothing "
                                 f"to learn from it")
        return [record["messages"] for record in records]

    def check(self) -> None:
        if not self.path.is_file():
            raise FileNotFoundError(f"recovery.path={str(self.path)!r} does not exist; give a JSONL file of {SCHEMA}")
        conversations = self.conversations()
        if not conversations:
            raise ValueError(f"recovery.path={str(self.path)!r} holds no conversations; give {SCHEMA} records")
        self.check_count(len(conversations), f"{len(conversations)} conversations")

    def examples(self, tokenizer) -> list[dict[str, list[int]]]:
        if self.chat_template is None and not tokenizer.chat_template:
            raise ValueError("recovery.data=chat: the model's tokenizer has no chat template; give one as "
                             "recovery.data.chat_template (a Jinja template, e.g. ChatML's)")
        return self.labelled([self.example(tokenizer, messages) for messages in self.conversations()])

    def render(self, tokenizer, messages: list[dict], reply: bool) -> str:
        return tokenizer.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False,
                                             add_generation_prompt=reply)

    def example(self, tokenizer, messages: list[dict]) -> dict[str, list[int]]:
        """The conversation in the template, cut at seq_len. An assistant turn's text is what the
        template adds from the prompt that asks for it to the conversation that ends with it; each
        piece is tokenised on its own, so that the labels fall exactly on the assistant's tokens."""
        text = self.render(tokenizer, messages, False)
        cuts, learned = [0], []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self.render(tokenizer, messages[:i], True) if i else ""
            through = self.render(tokenizer, messages[:i + 1], False)
            if not (through.startswith(before) and text.startswith(through)):
                raise ValueError("recovery.data=chat: the chat template does not write a conversation's first "
                                 "turns as the start of the whole, so the assistant's turns cannot be found in it")
            cuts += [len(before), len(through)]
            learned.append(len(cuts) - 2)  # the piece from `before` to `through`
        cuts.append(len(text))
        ids, labels = [], []
        for piece, (start, end) in enumerate(zip(cuts, cuts[1:])):
            tokens = tokenizer(text[start:end], add_special_tokens=False)["input_ids"]
            ids += tokens
            labels += tokens if piece in learned or self.options["train_on_inputs"] else [IGNORED] * len(tokens)
        limit = self.options["seq_len"]
        return {"input_ids": ids[:limit], "labels": labels[:limit]}
