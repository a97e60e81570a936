"""Instruct models evaluated as lm-eval evaluates them: `eval.chat_template` (the tokenizer's chat
template wraps each prompt as a user turn and opens the assistant's; a NAME picks one of several),
`eval.fewshot_as_multiturn` (each few-shot example a user/assistant exchange of its own) and
`eval.system_instruction` (a system turn, or plain text before the prompt without a template).

An instruct model scored on raw prompts gives numbers its model card and lm-eval do not, and a
pruned chat model's damage to following its template goes unseen; so the prompt is assembled the
way lm-eval 0.4.13 assembles it (`Task.fewshot_context`, `HFLM.apply_chat_template`), for the
lm-eval bridge (which hands these options to lm-eval's own `build_all_requests`) and for
prunebench's own multiple-choice and generation tasks (which build the same turns here). Tokenising
needs nothing new: a rendered prompt that starts with the template's BOS text gets no second BOS
(evaluation/encoding.py, lm-eval's rule).

Validation asks for a template before any model loads, reading the tokenizer's files (tokenizer_config.json,
chat_template.jinja, additional_chat_templates/) or a preset's GGUF header, never the weights."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from prunebench.api.chat_format import ChatFormat, chat_format
from prunebench.api.errors import ConfigError

log = logging.getLogger(__name__)

# lm-eval's default fewshot_delimiter: what separates the system instruction from a task's description
FEWSHOT_DELIMITER = "\n\n"
# model families whose tokenizers prompt a causal language model (a VLM's processor has its own template)
CHAT_FAMILIES = ("causal_lm", "moe")


# ---------------------------------------------------------------- the model's templates, unloaded

def folder_templates(folder: Path) -> dict[str, str] | None:
    """A tokenizer folder's chat templates by name, as transformers reads them: chat_template.jinja
    (`default`) and additional_chat_templates/NAME.jinja first, else tokenizer_config.json's
    `chat_template` (one text, or a list of {name, template}). None: the folder holds no tokenizer
    config to tell."""
    templates = {}
    if (folder / "chat_template.jinja").is_file():
        templates["default"] = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        templates.update({p.name.removesuffix(".jinja"): p.read_text(encoding="utf-8") for p in extra.glob("*.jinja")})
    if templates:
        return templates
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None
    return named(json.loads(config.read_text(encoding="utf-8")).get("chat_template"))


def named(template) -> dict[str, str]:
    """A tokenizer's `chat_template` attribute (None, one text or a dict) or config entry (a list) by name."""
    if not template:
        return {}
    if isinstance(template, str):
        return {"default": template}
    if isinstance(template, (list, tuple)):
        return {t["name"]: t["template"] for t in template}
    return dict(template)


def hub_templates(repo: str, revision: str | None) -> dict[str, str] | None:
    """A hub id's templates from the Hugging Face cache only (validation asks the hub nothing for
    this); None where the cache holds none of its tokenizer files, left to the check after loading."""
    from huggingface_hub import try_to_load_from_cache

    found = [try_to_load_from_cache(repo, name, revision=revision) for name in ("chat_template.jinja", "tokenizer_config.json")]
    cached = [Path(p) for p in found if isinstance(p, str)]
    return folder_templates(cached[0].parent) if cached else None


def stated_templates(model_cfg) -> dict[str, str] | None:
    """The model's chat templates by name without loading it: a checkpoint folder's or a cached hub
    id's tokenizer files; a preset loader's `stated_chat_templates` (a tiny model's none, a GGUF's
    header). None: not known before loading (checked once the tokenizer is there)."""
    from hydra.utils import get_method

    if "path" in model_cfg and "revision" in model_cfg:
        path = str(model_cfg.path)
        folder = Path(path).expanduser()
        return folder_templates(folder) if folder.is_dir() else hub_templates(path, model_cfg.revision)
    target = model_cfg.get("_target_")
    stated = getattr(get_method(target), "stated_chat_templates", None) if target else None
    return stated() if callable(stated) else stated


def shown(template: bool | str) -> str:
    """The option as a user types it (true, not Python's True)."""
    return str(template).lower() if isinstance(template, bool) else template


def selected(templates: dict[str, str], template: bool | str, model: str) -> str | None:
    """The name of the template `template` asks for among `templates` (lm-eval's and transformers'
    rule: True takes the only one, or `default` of several); ValueError naming the model and what
    it offers."""
    if not templates:
        raise ValueError(f"eval.chat_template={shown(template)}: model={model!r} has no chat template (its tokenizer "
                         f"carries none); use eval.chat_template=false, or an instruct model whose tokenizer has one "
                         f"(chat_template.jinja, or chat_template in tokenizer_config.json)")
    if template is True:
        if "default" in templates or len(templates) == 1:
            return None
        raise ValueError(f"eval.chat_template=true: model={model!r} has several chat templates and none named "
                         f"default; name one: eval.chat_template={sorted(templates)[0]} (its templates: {sorted(templates)})")
    if template not in templates:
        raise ValueError(f"eval.chat_template={template}: model={model!r} has no chat template of that name; "
                         f"its templates: {sorted(templates)} (or eval.chat_template=true for the default)")
    return template


def check(cfg) -> None:
    """Before the model loads: the three options, and a template the model actually has."""
    chat = chat_format(cfg.get("eval") or {})
    if not chat.templated:
        return
    family = cfg.model.get("family")
    if family not in CHAT_FAMILIES:
        raise ValueError(f"eval.chat_template={shown(chat.template)}: model={cfg.model.name!r} (family {family!r}) is no "
                         f"causal language model; chat templates apply to {list(CHAT_FAMILIES)}")
    templates = stated_templates(cfg.model)
    if templates is not None:
        selected(templates, chat.template, cfg.model.name)


def supports(task) -> bool:
    """A task whose prompts this module renders (its `renders_chat`): the lm-eval bridge, our
    multiple-choice tasks and our text generation tasks, not one that reads images (a processor's
    template renders those)."""
    return bool(getattr(task, "renders_chat", False))


def check_tasks(cfg, tasks: dict) -> None:
    """Every task the options would change renders them; a perplexity task reads no prompt (lm-eval
    applies no template to rolling log-likelihoods either) and is left as it is."""
    if chat_format(cfg.get("eval") or {}).plain:
        return
    from prunebench.api.requests import LOGLIKELIHOOD_ROLLING

    unsupported = [name for name, task in tasks.items()
                   if getattr(task, "kind", None) != LOGLIKELIHOOD_ROLLING and not supports(task)]
    if unsupported:
        raise ConfigError(f"eval.chat_template / fewshot_as_multiturn / system_instruction: task(s) {unsupported} "
                         f"have no chat rendering (only the lm-eval bridge, multiple-choice and text generation "
                         f"tasks do); evaluate them without these options")


# ---------------------------------------------------------------- rendering

class Renderer:
    """HFLM.apply_chat_template's rendering with the model's tokenizer: the conversation as text
    (not tokens), the assistant's turn opened after it (or the last message continued when no
    generation prompt is asked, lm-eval's gen_prefix); a template that refuses a system turn is
    rendered again without it, as lm-eval does (with a warning: the instruction is then lost)."""

    def __init__(self, tokenizer, template: bool | str, model: str):
        self.tokenizer, self.model = tokenizer, model
        templates = named(getattr(tokenizer, "chat_template", None))
        name = selected(templates, template, model)
        # a name picks that template's text; True passes nothing, as HFLM does, and the tokenizer takes its own
        self.kwargs = {} if name is None else {"chat_template": templates[name]}
        self.warned = False

    def __call__(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        import jinja2

        options = dict(tokenize=False, add_generation_prompt=add_generation_prompt,
                       continue_final_message=not add_generation_prompt, **self.kwargs)
        try:
            return self.tokenizer.apply_chat_template(messages, **options)
        except jinja2.exceptions.TemplateError as err:
            if not self.warned:
                log.warning("model=%s: its chat template refused the conversation (%s); rendered again without "
                            "the system turn, as lm-eval does (the system instruction and description are lost)",
                            self.model, err)
                self.warned = True
            return self.tokenizer.apply_chat_template([m for m in messages if m["role"] != "system"], **options)


def delimited(prefix: str | None, suffix: str | None, delimiter: str) -> str:
    """prefix and suffix joined by `delimiter` unless either is empty or whitespace already meets at
    the join (lm-eval's rule for the system instruction before a task's description)."""
    if not prefix:
        return suffix or ""
    if not suffix:
        return prefix
    return prefix + suffix if prefix[-1].isspace() or suffix[0].isspace() else prefix + delimiter + suffix


@dataclass
class ChatPrompt:
    """A task's prompts in a chat format: the turns lm-eval's fewshot_context builds, rendered as
    plain text (no template: each turn's text and the delimiter after it) or by the template, the
    few-shot examples as turns of their own (multiturn) or folded into one user turn."""

    format: ChatFormat
    render: Renderer | None = None

    def context(self, question: str, description: str = "", shots=(), target_delimiter: str = " ",
                fewshot_delimiter: str = FEWSHOT_DELIMITER) -> str:
        """`shots`: (question, answer) pairs, already rendered. The last turn is the document's
        question; the template then opens the assistant's answer."""
        turns = []  # (role, text, the delimiter after it as plain text)
        system = delimited(self.format.system, description, fewshot_delimiter)
        if system:
            turns.append(("system", system, ""))
        for shot, answer in shots:
            if answer is None or answer == "":
                turns.append(("user", shot, ""))
            else:
                turns += [("user", shot, target_delimiter), ("assistant", answer, fewshot_delimiter)]
        turns.append(("user", question, ""))
        if not self.format.templated:
            return "".join(text + after for _, text, after in turns)
        if self.format.multiturn:
            messages = [{"role": role, "content": text} for role, text, _ in turns]
        else:  # one user turn: every non-system turn as plain text, the last one's delimiter dropped
            rest = turns[1:] if turns[0][0] == "system" else turns
            user = "".join(text + after for _, text, after in rest[:-1]) + rest[-1][1]
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        return self.render(messages, add_generation_prompt=True)

    def target_delimiter(self, delimiter: str) -> str:
        """What precedes a choice after the context: nothing once the template has opened the
        assistant's turn (lm-eval's multiple_choice under apply_chat_template)."""
        return "" if self.format.templated else delimiter

    def lm_eval_options(self) -> dict:
        """lm-eval's Task.build_all_requests keyword arguments for this format."""
        return {"apply_chat_template": self.format.templated, "fewshot_as_multiturn": self.format.multiturn,
                "system_instruction": self.format.system, "chat_template": self.render}


def prepare(task, loaded, options) -> None:
    """Sets the chat format on `task` (and its members) before its requests are built; the plain
    format leaves every task as it was. A template the loaded tokenizer lacks is refused here too,
    for a model whose templates were not known before loading."""
    chat = chat_format(options or {})
    if chat.plain:
        return
    prompt = ChatPrompt(chat, Renderer(loaded.tokenizer, chat.template, loaded.name) if chat.templated else None)
    for member in [task, *getattr(task, "tasks", [])]:
        if supports(member):
            member.chat = prompt
