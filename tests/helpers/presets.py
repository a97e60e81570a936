"""The paper presets' stand-ins: tiny models and local files in place of a preset's real ones, and
the grid sizes the README's "Paper presets" table states (tests/test_presets.py)."""

from __future__ import annotations

from conftest import FIXTURES

from helpers.vlm_fixtures import SUITE_TASKS

# grid jobs, dense baselines: the README's "Paper presets" table states these
GRIDS = {"mop_llama2": (25, 1), "mop_llama3": (15, 1), "hies_bert_glue": (120, 8), "hies_llama2": (30, 1),
         "hies_vit": (60, 4), "dynmoe_olmoe": (5, 1), "mop_llava": (15, 1), "hies_llava": (15, 1), "owl": (12, 1),
         "reap": (8, 1), "dsnot": (18, 1), "structured_baselines": (18, 1), "calibration": (18, 1),
         "recovery": (18, 1), "llm_pruner_recovery": (4, 1), "instruct": (12, 2)}
QUICK = ["trainer=cpu", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "limit=2"]
LATENCY = ["bench.warmup=1", "bench.runs=1", "bench.new_tokens=4"]


def tiny(name: str, data) -> list[str]:
    """The overrides that put tiny models and local files in place of a preset's real ones."""
    root, alpaca, vision, (vlm_root, images, judge) = data
    common = [f"data_dir={root}", *QUICK]
    if name.endswith("_llava"):  # the fixtures' ScienceQA questions stand in for its train split
        tasks = ("vizwiz_vqa", "mm_vet") if name == "hies_llava" else SUITE_TASKS
        # four new tokens an answer: what is scored (the judge's replies, the submission file) needs no more
        vlm = [f"data_dir={vlm_root}", *QUICK, "model=tiny-llava", f"judge.url={judge}", "judge.model=test-judge",
               "judge.api_key_env=null", *(f"task.tasks.{t}.image_dir={images}" for t in tasks),
               *(f"task.tasks.{t}.max_gen_toks=4" for t in tasks)]
        if name == "hies_llava":
            return [*vlm, "calib.n_samples=2"]
        calib = "calib.task.tasks.scienceqa_img"
        return [*vlm, "model.text_config.num_hidden_layers=6", "calib.n_samples=2", f"{calib}.image_dir={images}",
                f"{calib}.source.path={vlm_root / 'scienceqa' / 'llava_test_CQM-A.json'}", "calib.allow_eval_split=true"]
    if name == "instruct":  # tiny-llama with a chat template, as a checkpoint folder; MMLU is no fixture
        return [*common, "model=hf_causal", f"model.path={root / 'tiny-instruct'}", "calib.n_samples=2",
                "calib.seq_len=16", "calib.allow_eval_split=true", "task.lm_eval=[]"]
    if name.startswith("mop"):  # six blocks: MoP's L steps keep the last two
        return [*common, "model=tiny-llama", "model.config.num_hidden_layers=6", f"calib.path={alpaca}",
                "calib.n_samples=3", *LATENCY]
    if name == "hies_bert_glue":
        return [*common, "model=tiny-bert-cls", "calib.n_samples=4"]
    if name == "hies_llama2":
        return [*common, "model=tiny-llama", "calib.n_samples=2", "calib.seq_len=16"]
    if name == "reap":  # WikiText-2 windows stand in for C4, the local questions for lm-eval's tasks
        return [*common, "model=tiny-qwen3-moe", "calib=wikitext2", "calib.n_samples=2", "calib.seq_len=16",
                "task=local_mc", f"task.tasks.local_mc.source.path={FIXTURES / 'mc_questions.jsonl'}"]
    if name in ("owl", "dsnot"):  # WikiText-2 train stands in for C4 and for the test split the fixture lacks
        return [*common, "model=tiny-llama", "model.config.max_position_embeddings=2048", "calib=wikitext2",
                "calib.n_samples=2", "calib.seq_len=16", "calib.allow_eval_split=true",
                "task.tasks.wikitext2_ppl.source.split=train", "task.tasks.wikitext2_ppl.seq_len=32"]
    if name == "calibration":  # the fixture's WikiText-2 train windows; its hellaswag file in lm-eval's layout
        return [*common, "model=tiny-llama", "model.config.max_position_embeddings=2048", "calib.seq_len=16",
                "task.tasks.wikitext2_ppl.source.split=train", "task.tasks.wikitext2_ppl.seq_len=32",
                "calib.allow_eval_split=true"]
    if name == "structured_baselines":  # six blocks: SLEB keeps its first and last; WikiText-2 train as above
        return [*common, "model=tiny-llama", "model.config.num_hidden_layers=6", "model.config.max_position_embeddings=2048",
                "calib.n_samples=2", "calib.seq_len=16", "calib.allow_eval_split=true",
                "task.tasks.wikitext2_ppl.source.split=train", "task.tasks.wikitext2_ppl.seq_len=32", *LATENCY]
    if name in ("recovery", "llm_pruner_recovery"):  # six blocks for LLM-Pruner's range; one quick recovery step
        quick = ["recovery.seq_len=16", "recovery.batch_size=2", "recovery.micro_batch_size=2", "recovery.val_samples=2",
                 "recovery.max_steps=1", "recovery.warmup_steps=0",
                 # the fixture's WikiText-2 train file stands in for the evaluated test split too
                 "recovery.allow_eval_split=true"]
        if name == "llm_pruner_recovery":  # alpaca-cleaned is on the hub
            quick += ["recovery.data=file", f"recovery.path={alpaca}", "recovery.seq_len=512"]
        return [*common, "model=tiny-llama", "model.config.num_hidden_layers=6", "model.config.max_position_embeddings=2048",
                "calib.n_samples=2", "calib.seq_len=16", "calib.allow_eval_split=true", *quick,
                "task.tasks.wikitext2_ppl.source.split=train", "task.tasks.wikitext2_ppl.seq_len=32"]
    if name == "hies_vit":
        paths = [f"vision_data.imagenet1k.eval={vision['imagenet1k'][0]}",
                 f"vision_data.imagenet1k.train={vision['imagenet1k'][1]}"]
        for ds in ("cifar100", "food101", "fashion_mnist"):  # validation reads no checkpoint: any path will do
            paths += [f"vision_data.{ds}.eval={vision[ds][0]}", f"vision_data.{ds}.train={vision['imagenet1k'][1]}",
                      f"vision_data.{ds}.checkpoint={alpaca}"]
        return [*common, "model=tiny-vit", "calib.n_samples=4", "bench.warmup=1", "bench.runs=1",
                "bench.throughput_batch=2", *paths]
    arc_dev = FIXTURES / "benchmarks" / "arc" / "ARC-Easy-Test.jsonl"  # ARC-e's OpenCompass version reads dev
    return [*common, "model=tiny-olmoe", "limit=1", f"task.protocols.opencompass.arc_easy.source.path={arc_dev}",
            "task.tasks.bbh_cot_fewshot.subtasks=[boolean_expressions,date_understanding]",
            "task.tasks.bbh_cot_fewshot.max_gen_toks=8"]
