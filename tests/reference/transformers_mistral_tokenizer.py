"""gclab's tokenizer.json BPE (Mistral-Small-3.1's "tekken" tokenizer as transformers ships it: a tokenizer.json
and no vocab.json / merges.txt) against transformers, through `gclab tokenize`, in FLUX.2-dev's chat template:

  transformers_mistral_tokenizer.py GCLAB_EXE WORK_DIR

A byte-level BPE with Tekken's rules (no normalizer; a Split pre-tokenizer on Tekken's regex, isolated, then
ByteLevel without its own regex; ignore_merges) and Mistral's control tokens as added tokens is trained here with
the tokenizers library from a small generated text (no downloads) and saved as WORK/tokenizer/tokenizer.json
with a tokenizer_config.json naming <pad>. The captions of the other tokenizer tests, and [IMG] and control
tokens inside captions, must get the same ids from `gclab tokenize --component text_encoder` (arch flux2) as
from transformers' PreTrainedTokenizerFast on that file called as FLUX.2's pipeline calls it: the prompt with
"[IMG]" removed in the template <s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST] (the chat template writes
the special tokens, so none are added), padded to 512, truncated; the same with the merges written as
"a b" strings (the older form). A tokenizer.json gclab cannot follow (a Metaspace pre-tokenizer) is refused
by name. Exit 77 without transformers / tokenizers.
"""
import json
import os
import random
import subprocess
import sys

from transformers_clip_tokenizer import EDGE
from tokenizer_check import WORDS, captions, compare, corpus, train_byte_level_bpe

# Tekken's pre-tokenizer regex (mistral-common's tekken.json "pattern", as its tokenizer.json's Split has it).
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
          r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SYSTEM = ("You are an AI that reasons about image descriptions. You give structured responses focusing on object "
          "relationships, object\nattribution and actions without speculation.")
TEMPLATE = "<s>[SYSTEM_PROMPT]" + SYSTEM + "[/SYSTEM_PROMPT][INST]{}[/INST]"
SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "<pad>", "[IMG]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"]
MORE = ["a [IMG] cat", "[IMG][IMG]x", "nested [INST] inside", "CamelCase HTTPServer iPhone", "path/to/file.png",
        "two\nlines", "para\n\nbreak", "   leading", "trailing   ", "12345 67.89", "l'été dernier"]


def main():
    exe, work = sys.argv[1], sys.argv[2]
    try:
        import tokenizers  # noqa: F401
        from transformers import PreTrainedTokenizerFast
    except Exception as e:
        print(f"reference unavailable: {e}", file=sys.stderr)
        sys.exit(77)
    rng = random.Random(3)
    lines = corpus(rng)
    lines += ["Été café naïve 東京 Zürich 0123456789 . , ! ? ; : ' \" ( ) - — / # & % CamelCase path/to\n\n  x"] * 20
    lines += [TEMPLATE.format("a cat")] * 20
    tok = train_byte_level_bpe(TEKKEN, SPECIALS, 600, lines, ignore_merges=True)
    folder = os.path.join(work, "tokenizer")
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>"}, f)
    reference = PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"), pad_token="<pad>")
    texts = captions(rng, WORDS) + EDGE + MORE
    want = [reference(TEMPLATE.format(t.replace("[IMG]", "")), add_special_tokens=False, padding="max_length",
                      max_length=512, truncation=True).input_ids for t in texts]
    failures = compare(exe, work, "flux2", "text_encoder", folder, texts, want, "flux2 (Mistral), in its chat template")
    # The older form of the same file: each merge one "a b" string.
    spec = json.loads(tok.to_str())
    spec["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
    strings = os.path.join(work, "string_merges")
    os.makedirs(strings, exist_ok=True)
    with open(os.path.join(strings, "tokenizer.json"), "w") as f:
        json.dump(spec, f)
    failures += compare(exe, work, "flux2", "text_encoder", strings, texts, want, "the same, merges as strings")
    # A tokenizer.json of another kind (SentencePiece's Metaspace) is refused, naming the step.
    bad = os.path.join(work, "metaspace")
    os.makedirs(bad, exist_ok=True)
    spec = json.loads(tok.to_str())
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    with open(os.path.join(bad, "tokenizer.json"), "w") as f:
        json.dump(spec, f)
    r = subprocess.run([exe, "tokenize", os.path.join(work, "config.yaml"), "--component", "text_encoder",
                        "--tokenizer", bad, "--", "x"], capture_output=True, text=True)
    assert r.returncode == 2 and "Metaspace" in r.stderr, f"exit {r.returncode}: {r.stderr}"
    print(f"a Metaspace tokenizer.json: exit 2 ({r.stderr.strip().splitlines()[-1]})")
    assert failures == 0


if __name__ == "__main__":
    main()
