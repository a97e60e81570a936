"""The chat format a run's prompts are rendered in (`eval.chat_template`, `eval.fewshot_as_multiturn`,
`eval.system_instruction`): the options as data, checked, and the words a report's heading uses.
The rendering is evaluation/chat.py's."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class ChatFormat:
    """`template`: False (raw prompts), True (the tokenizer's template; its `default` where it has
    several) or the name of one of its templates."""

    template: bool | str = False
    multiturn: bool = False
    system: str | None = None

    @property
    def templated(self) -> bool:
        return self.template is not False

    @property
    def plain(self) -> bool:
        """What every run did before these options existed: the prompts as they were."""
        return not self.templated and not self.multiturn and self.system is None

    def label(self) -> str:
        """What a report's heading says (`chat=template`, `chat=none`), each option that changes the
        prompt named, a system instruction by a digest of its text."""
        words = ["none" if not self.templated else "template" if self.template is True else f"template:{self.template}"]
        if self.multiturn:
            words.append("multiturn")
        if self.system is not None:
            words.append(f"system@{hashlib.sha256(self.system.encode()).hexdigest()[:8]}")
        return "+".join(words)


def chat_format(options) -> ChatFormat:
    """The eval node's three options, each checked (ValueError naming the value and what is valid)."""
    get = options.get if hasattr(options, "get") else lambda key, default=None: default
    template, multiturn, system = (get("chat_template", False), get("fewshot_as_multiturn", False),
                                   get("system_instruction", None))
    if template is None:
        template = False
    if not isinstance(template, (bool, str)) or template == "":
        raise ValueError(f"eval.chat_template={template!r}: true (the tokenizer's chat template), false (raw "
                         f"prompts) or the name of one of the tokenizer's templates")
    if template in ("true", "false"):  # a quoted boolean from a shell or a sweep's string
        template = template == "true"
    if not isinstance(multiturn, bool):
        raise ValueError(f"eval.fewshot_as_multiturn={multiturn!r}: true or false")
    if system is not None and not isinstance(system, str):
        raise ValueError(f"eval.system_instruction={system!r}: a text (quote it) or null")
    if multiturn and template is False:
        raise ValueError("eval.fewshot_as_multiturn=true needs eval.chat_template=true (or a template's name): "
                         "few-shot turns exist only in a chat template, and lm-eval refuses it too")
    return ChatFormat(template, multiturn, system)
