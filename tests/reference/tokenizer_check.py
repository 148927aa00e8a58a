"""What the tokenizer reference tests share: the words their corpora are made of, the captions they compare
(plain, unicode, punctuation, digits, odd white space, unseen words, long ones cut), and the comparison of
`gclab tokenize`'s ids with a reference tokenizer's."""
import os
import subprocess

WORDS = ("a photo of the cat dog red blue green circle square on in with at night day woman man city street tree sky "
         "painting portrait landscape mountain river golden hour soft light shadow glass water reflection wooden "
         "table old new small large bright dark").split()


def corpus(rng, lines=3000):
    """The training text of the tests' tokenizers: lines of 3 to 12 of the words."""
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(lines)]


def captions(rng, words=WORDS):
    odd = ["Été", "café", "naïve", "東京", "Zürich", "ångström", "😀", "façade", "€5", "n°3", "Ω", "ß", "İstanbul", "ﬁne"]
    punct = [",", ".", "!", "?", ";", ":", "'", '"', "(", ")", "-", "—", "…", "/", "#", "&", "%"]
    out = ["", " ", "a", "A photo of a cat.", "a  photo   of\ta\ncat", "  leading and trailing  ", "don't stop!",
           "UPPER lower MiXeD", "3.14 and 42, 1e5", "an out-of-vocabulary word: xylophone quokka"]
    for i in range(300):
        n = rng.randint(1, 60 if i % 10 == 0 else 14)
        parts = []
        for _ in range(n):
            r = rng.random()
            parts.append(rng.choice(odd) if r < 0.1 else rng.choice(punct) if r < 0.2 else
                         str(rng.randint(0, 2000)) if r < 0.25 else rng.choice(words).capitalize() if r < 0.35 else
                         rng.choice(words))
        sep = rng.choice([" ", " ", " ", "  ", ", "])
        out.append(sep.join(parts))
    return out


def compare(exe, work, arch, component, folder, texts, want, label, extra=()):
    """Runs `gclab tokenize` for `arch`'s `component` with the tokenizer in `folder`; prints the first
    mismatches and a summary line; returns how many captions differ from `want`."""
    yaml = os.path.join(work, "config.yaml")
    with open(yaml, "w") as f:
        f.write(f"name: tok\ndevice: cpu\nmodel: {{arch: {arch}}}\ndatasets: [{{folder_path: {work}}}]\n"
                "train: {steps: 1}\n")
    out = subprocess.run([exe, "tokenize", yaml, "--component", component, "--tokenizer", folder, *extra, "--",
                          *texts], check=True, capture_output=True, text=True).stdout.splitlines()
    assert len(out) == len(texts), f"{len(out)} lines for {len(texts)} captions"
    wrong = [(t, w, o) for t, w, o in zip(texts, want, out) if [int(x) for x in o.split()] != list(w)]
    for t, w, o in wrong[:5]:
        print(f"MISMATCH ({label}) {t!r}\n  transformers {w}\n  gclab        {o}")
    print(f"{label}: {len(texts) - len(wrong)} of {len(texts)} captions give transformers' ids")
    return len(wrong)


def train_byte_level_bpe(pattern, specials, vocab_size, lines, nfc=False, ignore_merges=False):
    """A byte-level BPE as Qwen's and Mistral's tokenizers are built (the tokenizers library): NFC or no
    normalizer, a Split on `pattern` (isolated) then ByteLevel without its own regex, `specials` as added
    tokens, trained on `lines` (no downloads)."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=specials)
    tok.train_from_iterator(lines, trainer)
    return tok
