"""gclab's CLIP tokenizer (byte-level BPE, ICU for the Unicode rules) against transformers' CLIPTokenizer, through
`gclab tokenize`:

  transformers_clip_tokenizer.py GCLAB_EXE WORK_DIR

A byte-level BPE with CLIP's rules (NFC, runs of white space to one space, lower case; CLIP's pre-tokenizer
regex; "</w>" on each word's last symbol) is trained here with the tokenizers library from a small generated
text (no downloads) and saved as WORK/tokenizer/{vocab.json, merges.txt} (and WORK/tokenizer_2 with SD3's
bigG pad token "!"); the captions of the T5 test (plain, unicode, punctuation, digits, odd white space,
unseen words, long ones cut) plus some Unicode edge cases must get the same ids from `gclab tokenize
--component text_encoder` as from transformers' CLIPTokenizer.from_pretrained(WORK/tokenizer) with
padding="max_length", max_length=77, truncation=True, as FLUX's and SD3's pipelines call it. Exit 77
without transformers / tokenizers.
"""
import json
import os
import random
import sys

from tokenizer_check import WORDS, captions, compare, corpus

MAX_LENGTH = 77
EDGE = ["İstanbul ΣΊΣΥΦΟΣ σ", "Ǆemal ﬁne ŉ", "tab\there\u00a0nbsp\u3000ideographic\u2028line", "e\u0301 vs é (NFC)",
        "emoji 😀👍🏽 and ZWJ 👩‍👩‍👧", "digits ٣٤٥ and ²³ ½", "mixed日本語text中文", "it's they're we've I'm you'll he'd",
        "IT'S LOUD", "''''", "a<|endoftext|>b <|startoftext|>c", "\u0001control\u0007chars", "ﬀ ﬃ ẞ ß", "Ωmega Å",
        "x" * 400, "word " * 100]


def main():
    exe, work = sys.argv[1], sys.argv[2]
    try:
        from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
        from transformers import CLIPTokenizer
    except Exception as e:
        print(f"reference unavailable: {e}", file=sys.stderr)
        sys.exit(77)
    rng = random.Random(1)
    words = WORDS
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(3000)]
    lines += ["Été café naïve 東京 Zürich 0123456789 . , ! ? ; : ' \" ( ) - — / # & % it's we're I'm σ"] * 20
    # CLIP's tokenizer as transformers builds it, trained on that text.
    tok = Tokenizer(models.BPE(end_of_word_suffix="</w>", unk_token="<|endoftext|>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "),
                                           normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|"""
                                   r"""[^\s\p{L}\p{N}]+"""), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    trainer = trainers.BpeTrainer(vocab_size=400, end_of_word_suffix="</w>", show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["!", "<|startoftext|>", "<|endoftext|>"])
    tok.train_from_iterator(lines, trainer)
    texts = captions(rng, words) + EDGE
    failures = 0
    for slot, pad, arch in (("tokenizer", "<|endoftext|>", "flux"), ("tokenizer_2", "!", "sd3")):
        folder = os.path.join(work, slot)
        os.makedirs(folder, exist_ok=True)
        tok.model.save(folder)  # vocab.json, merges.txt
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump({"pad_token": pad, "model_max_length": MAX_LENGTH}, f)
        reference = CLIPTokenizer.from_pretrained(folder)
        want = reference(texts, padding="max_length", max_length=MAX_LENGTH, truncation=True).input_ids
        component = "text_encoder" if slot == "tokenizer" else "text_encoder_2"
        failures += compare(exe, work, arch, component, folder, texts, want, f"{slot} (pad {pad!r})")
    print(f"{sum(1 for t in texts if len(reference(t).input_ids) > MAX_LENGTH)} captions cut at {MAX_LENGTH}")
    assert failures == 0

if __name__ == "__main__":
    main()
